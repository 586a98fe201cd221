#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

// transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens special_tokens_map holds.
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read the file", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

OrderedJson read_json(const fs::path& path) {
  return parse_json<OrderedJson>(read_text(path), path.string());
}

// A special token is a string or an AddedToken object {"content": ..., "lstrip": ...}.
std::optional<std::string> token_text(const OrderedJson& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

ChatTemplate ChatTemplate::from_templates(const std::map<std::string, std::string>& templates,
                                          const OrderedJson& special_tokens, const std::string& origin) {
  ChatTemplate t;
  t.origin_ = origin;
  if (!special_tokens.is_object()) fail("{}: special tokens must be a JSON object", origin);
  t.special_tokens_ = special_tokens;
  for (const auto& [name, source] : templates) {
    std::string label = name == "default" ? origin : origin + " (" + name + ")";
    t.templates_.emplace(name, jinja::Template(source, {.name = label}));
  }
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  const fs::path root(dir);
  const fs::path config_path = root / "tokenizer_config.json";
  OrderedJson config = fs::exists(config_path) ? read_json(config_path) : OrderedJson::object();
  if (!config.is_object()) fail("{}: expected a JSON object", config_path.string());

  std::map<std::string, std::string> templates;
  std::string origin;
  // transformers v5 saves templates as files; they take precedence over tokenizer_config.json.
  const fs::path jinja_path = root / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    templates["default"] = read_text(jinja_path);
    origin = jinja_path.string();
  }
  const fs::path extra_dir = root / "additional_chat_templates";
  if (fs::is_directory(extra_dir)) {
    for (const auto& entry : fs::directory_iterator(extra_dir)) {
      if (entry.path().extension() == ".jinja") templates[entry.path().stem().string()] = read_text(entry.path());
    }
    if (origin.empty() && !templates.empty()) origin = extra_dir.string();
  }
  if (templates.empty() && config.contains("chat_template") && !config["chat_template"].is_null()) {
    const OrderedJson& value = config["chat_template"];
    origin = config_path.string();
    if (value.is_string()) {
      templates["default"] = value.get<std::string>();
    } else if (value.is_array()) {
      for (const OrderedJson& item : value) {
        if (!item.is_object() || !item.contains("name") || !item.contains("template") || !item["name"].is_string() ||
            !item["template"].is_string()) {
          fail("{}: chat_template entries must be {{\"name\": ..., \"template\": ...}} objects", config_path.string());
        }
        templates[item["name"].get<std::string>()] = item["template"].get<std::string>();
      }
    } else {
      fail("{}: chat_template must be a string or a list of {{name, template}} objects", config_path.string());
    }
  }
  const fs::path legacy_path = root / "chat_template.json";
  if (templates.empty() && fs::exists(legacy_path)) {
    OrderedJson legacy = read_json(legacy_path);
    if (legacy.is_object() && legacy.contains("chat_template") && legacy["chat_template"].is_string()) {
      templates["default"] = legacy["chat_template"].get<std::string>();
      origin = legacy_path.string();
    }
  }
  if (origin.empty()) origin = dir;

  OrderedJson special = OrderedJson::object();
  const fs::path map_path = root / "special_tokens_map.json";
  OrderedJson special_map = fs::exists(map_path) ? read_json(map_path) : OrderedJson::object();
  for (const char* name : kSpecialTokenNames) {
    std::optional<std::string> text;
    if (config.contains(name)) {
      text = token_text(config[name]);
    } else if (special_map.is_object() && special_map.contains(name)) {
      text = token_text(special_map[name]);
    }
    if (text) special[name] = *text;
  }

  ChatTemplate t = from_templates(templates, special, origin);
  if (templates.empty()) t.origin_ = dir;
  return t;
}

std::string ChatTemplate::render(const OrderedJson& messages, const OrderedJson& tools, bool add_generation_prompt,
                                 const OrderedJson& extra_kwargs, const jinja::RenderOptions& options) const {
  return render_marked(messages, tools, add_generation_prompt, extra_kwargs, options).text;
}

jinja::RenderedText ChatTemplate::render_marked(const OrderedJson& messages, const OrderedJson& tools,
                                                bool add_generation_prompt, const OrderedJson& extra_kwargs,
                                                const jinja::RenderOptions& options) const {
  if (templates_.empty()) {
    fail(
        "{}: the model has no chat template (no chat_template.jinja, and no chat_template in "
        "tokenizer_config.json); add one to the model directory, or send raw prompts to /v1/completions",
        origin_);
  }
  if (!messages.is_array()) fail("chat template: messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) fail("chat template: tools must be null or a JSON array");
  if (!extra_kwargs.is_null() && !extra_kwargs.is_object()) {
    fail("chat template: extra template arguments must be a JSON object");
  }

  // get_chat_template(): "tool_use" when tools are given and the model has one, else "default".
  auto it = templates_.end();
  if (!tools.is_null()) it = templates_.find("tool_use");
  if (it == templates_.end()) it = templates_.find("default");
  if (it == templates_.end()) {
    std::string names;
    for (const auto& [name, t] : templates_) names += (names.empty() ? "'" : ", '") + name + "'";
    fail("{}: the model has several chat templates ({}) and none is named 'default'", origin_, names);
  }

  // Everything the client sent is input; the model's special tokens and the flags are not. Roles
  // stay unmarked: templates build markup from them ('<|' + role + '|>') and requests may only
  // name known roles.
  jinja::InputMarking marking{.variables = {"messages", "tools"}, .trusted_keys = {"role"}};
  OrderedJson variables = OrderedJson::object();
  variables["messages"] = messages;
  variables["tools"] = tools;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [key, value] : special_tokens_.items()) variables[key] = value;
  if (extra_kwargs.is_object()) {
    for (const auto& [key, value] : extra_kwargs.items()) {
      if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt") {
        fail("chat template: '{}' cannot be passed as an extra template argument", key);
      }
      variables[key] = value;
      marking.variables.push_back(key);
    }
  }
  return it->second.render_marked(variables, marking, options);
}

}  // namespace spill
