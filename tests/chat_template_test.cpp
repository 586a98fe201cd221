// spill::ChatTemplate against transformers: tests/data/chat_templates/cases.json holds, for every
// real template in that folder and a set of conversations, the text transformers'
// render_jinja_template produced (or the error it raised); tools/fixtures/make_chat_template_fixtures.py
// writes it. Every case must come out byte for byte the same. Further tests cover how a model
// directory is read (which template, which special tokens).
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

const fs::path kTemplateDir = fs::path(SPILL_TEST_DATA) / "chat_templates";
const fs::path kCasesPath = kTemplateDir / "cases.json";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct FixtureCase {
  std::string name;  // <template>__<scenario>, or "MissingFixture"
  size_t index = 0;
};

void PrintTo(const FixtureCase& c, std::ostream* os) {
  *os << c.name;
}

// Read at start-up by every process of the suite (the cases are the test parameters), so parsed by
// the library's parse_json, compiled optimised, rather than in this file (at -O0 under SPILL_TESTS_O0).
const OrderedJson& fixture() {
  static const OrderedJson data =
      fs::exists(kCasesPath) ? parse_json<OrderedJson>(read_file(kCasesPath), kCasesPath.string()) : OrderedJson();
  return data;
}

std::vector<FixtureCase> fixture_cases() {
  const OrderedJson& data = fixture();
  if (data.is_null()) return {{"MissingFixture", 0}};
  std::vector<FixtureCase> cases;
  for (size_t i = 0; i < data["cases"].size(); ++i) {
    const OrderedJson& c = data["cases"][i];
    std::string name = c["template"].get<std::string>() + "__" + c["scenario"].get<std::string>();
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    cases.push_back({name, i});
  }
  return cases;
}

// cases.json "now" (strftime_now() was pinned to it), e.g. "2025-03-14T09:26:53".
jinja::RenderOptions fixture_now() {
  std::tm tm{};
  std::istringstream in(fixture()["now"].get<std::string>());
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  std::time_t t = timegm(&tm);  // fills in the weekday and day of the year
  gmtime_r(&t, &tm);
  jinja::RenderOptions options;
  options.now = tm;
  return options;
}

const ChatTemplate& fixture_template(const std::string& name) {
  static std::map<std::string, ChatTemplate> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const OrderedJson& info = fixture()["templates"][name];
    std::string file = info["file"].get<std::string>();
    it = cache
             .emplace(name, ChatTemplate::from_templates({{"default", read_file(kTemplateDir / file)}},
                                                         info["special_tokens"], file))
             .first;
  }
  return it->second;
}

class TransformersCase : public testing::TestWithParam<FixtureCase> {};

TEST_P(TransformersCase, RendersByteIdentically) {
  if (GetParam().name == "MissingFixture") {
    FAIL() << kCasesPath.string() << " is missing: run `python3 tools/fixtures/make_chat_template_fixtures.py` "
           << "from the repository root (it needs jinja2; with transformers installed it uses transformers' renderer)";
  }
  const OrderedJson& c = fixture()["cases"][GetParam().index];
  const ChatTemplate& t = fixture_template(c["template"].get<std::string>());
  auto render = [&] {
    return t.render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["extra_kwargs"],
                    fixture_now());
  };
  if (c.contains("expected")) {
    std::string out;
    try {
      out = render();
    } catch (const Error& e) {
      FAIL() << "threw: " << e.what();
    }
    EXPECT_EQ(out, c["expected"].get<std::string>());
    return;
  }
  const std::string type = c["expected_error"]["type"].get<std::string>();
  const std::string message = c["expected_error"]["message"].get<std::string>();
  try {
    std::string out = render();
    FAIL() << "expected " << type << ": " << message << "\nrendered: " << out;
  } catch (const Error& e) {
    if (type == "TemplateError") {
      EXPECT_EQ(std::string(e.what()), message);  // raise_exception's message, verbatim
    } else {
      EXPECT_TRUE(std::string(e.what()).ends_with(": " + type + ": " + message))
          << e.what() << "\nexpected it to end with: " << type << ": " << message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, TransformersCase, testing::ValuesIn(fixture_cases()),
                         [](const testing::TestParamInfo<FixtureCase>& info) { return info.param.name; });

// ---- reading a model directory -------------------------------------------------------------------

class ModelDir {
 public:
  ModelDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("spill-chat-template-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~ModelDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ModelDir(const ModelDir&) = delete;
  ModelDir& operator=(const ModelDir&) = delete;

  void write(const std::string& name, const std::string& text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Expected strings from jinja2 with transformers' environment and the same variables.
const char* kProbe =
    "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}{{ tools|length if tools else \\\"-\\\" }}"
    "{{ add_generation_prompt }}{{ enable_thinking }}";

const OrderedJson kHi = OrderedJson::parse(R"([{"role": "user", "content": "hi"}])");
const OrderedJson kTools = OrderedJson::parse(R"([{"type": "function"}])");

TEST(ChatTemplateDir, StringTemplateAndTokensInTokenizerConfig) {
  ModelDir dir;
  dir.write("tokenizer_config.json", std::string(R"({"chat_template": ")") + kProbe +
                                         R"(", "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                                            "pad_token": null})");
  ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
  ASSERT_TRUE(t.has_template());
  EXPECT_EQ(t.special_tokens(), OrderedJson::parse(R"({"bos_token": "<s>", "eos_token": "</s>"})"));
  EXPECT_EQ(t.render(kHi, nullptr, true, nullptr), "<s>[hi]</s>-True");
  // Extra kwargs are template variables and override special tokens.
  EXPECT_EQ(t.render(kHi, kTools, false, OrderedJson::parse(R"({"bos_token": "<B>", "enable_thinking": false})")),
            "<B>[hi]</s>1FalseFalse");
  EXPECT_THROW(t.render(kHi, nullptr, true, OrderedJson::parse(R"({"messages": []})")), Error);
}

TEST(ChatTemplateDir, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "plain"},
                                                           {"name": "tool_use", "template": "with tools"}]})");
  ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
  EXPECT_EQ(t.render(kHi, nullptr, true, nullptr), "plain");
  EXPECT_EQ(t.render(kHi, kTools, true, nullptr), "with tools");
  EXPECT_EQ(t.render(kHi, OrderedJson::array(), true, nullptr), "with tools");  // transformers: `tools is not None`
}

TEST(ChatTemplateDir, WithoutDefaultTheChoiceIsAnError) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "r"}]})");
  ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
  EXPECT_THROW(t.render(kHi, nullptr, true, nullptr), Error);
}

TEST(ChatTemplateDir, JinjaFilesTakePrecedence) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "from config", "eos_token": "</s>"})");
  dir.write("chat_template.jinja", "from file {{ eos_token }}\n");
  dir.write("additional_chat_templates/tool_use.jinja", "tool file");
  ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
  EXPECT_EQ(t.render(kHi, nullptr, true, nullptr), "from file </s>");
  EXPECT_EQ(t.render(kHi, kTools, true, nullptr), "tool file");
}

TEST(ChatTemplateDir, SpecialTokensMapFillsIn) {
  ModelDir dir;
  dir.write("tokenizer_config.json",
            R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|{{ mask_token }}",
                                        "eos_token": "</s>"})");
  dir.write("special_tokens_map.json",
            R"({"bos_token": {"content": "<s>"}, "eos_token": "<ignored>", "pad_token": "<pad>"})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).render(kHi, nullptr, true, nullptr), "<s>|</s>|<pad>||");
}

TEST(ChatTemplateDir, NoTemplateIsAClearError) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
  EXPECT_FALSE(t.has_template());
  try {
    t.render(kHi, nullptr, true, nullptr);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat template"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateDir, SyntaxErrorsNameTheFile) {
  ModelDir dir;
  dir.write("chat_template.jinja", "{% for m in messages %}\n{{ m.content }}");
  try {
    ChatTemplate::from_model_dir(dir.path());
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja:2: TemplateSyntaxError"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spill
