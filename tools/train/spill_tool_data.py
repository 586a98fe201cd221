"""Synthetic tool-use conversations for spill-tiny (standard library only, deterministic by seed).

spill-tiny learns to call tools the Qwen2.5/Hermes way: the tools are listed in the system turn
(the chat template in spill_tokenizer.py renders them) and the assistant answers with

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Conversations (messages in the OpenAI chat format, plus the tool schemas) are made here; the
training script renders every one through the chat template, so the training text is exactly
what spill's server sends for the same request.

Each conversation: an optional system message; 1-4 tools drawn from TOOLS (always including the
one asked for); a user request that names concrete argument values drawn from lists (cities,
file paths, queries ...); the assistant's reply is exactly one tool call whose arguments are a
JSON object with its keys in the schema's order (optional parameters only when the user mentions
them). In about 60% of them the conversation goes on: the tool's result (a plausible JSON or text
result) and a short answer that uses it. Some conversations have tools but ask a plain Python
question (or make small talk), answered without a call, so that the model also learns when not
to call.

    python3 tools/train/spill_tool_data.py     # prints samples; checks the template if jinja2 is there
"""

from __future__ import annotations

import json
import random
import re

# ----------------------------------------------------------------------------------------------
# Value lists
# ----------------------------------------------------------------------------------------------

CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Cairo", "Lima", "Sydney",
          "Toronto", "Seoul", "Mumbai", "Nairobi", "Lisbon", "Vienna", "Dublin", "Prague", "Boston",
          "Denver", "Austin", "Chicago", "Zurich", "Helsinki", "Warsaw", "Athens", "Bangkok", "Jakarta",
          "Santiago", "Montreal", "Stockholm", "Amsterdam", "Istanbul", "Seattle", "Havana", "Reykjavik"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy"]
TIMEZONES = ["Europe/Paris", "America/New_York", "Asia/Tokyo", "UTC", "Europe/London", "Australia/Sydney",
             "America/Los_Angeles", "Asia/Kolkata", "Europe/Berlin", "America/Chicago", "Asia/Singapore",
             "Africa/Cairo", "America/Sao_Paulo", "Pacific/Auckland"]
FILES = ["src/main.py", "setup.py", "README.md", "tests/test_api.py", "app/models.py", "config/settings.yaml",
         "docs/index.md", "lib/utils.py", "scripts/build.sh", "pyproject.toml", "src/server/http.py",
         "data/users.csv", "app/views.py", "src/cli.py", "tests/conftest.py", "Makefile", "src/db/schema.sql",
         "notes.txt", "requirements.txt", "src/parser.py", "app/routes.py", "lib/cache.py", ".gitignore",
         "tools/train/train.py", "src/config.py", "CHANGELOG.md"]
DIRS = ["src", "tests", "docs", "src/server", "app", "scripts", "lib", ".", "tools/train", "examples",
        "data", "config", "src/db", "app/templates", "build"]
CODE_QUERIES = ["def parse_args", "class Config", "import numpy", "TODO", "raise ValueError", "async def fetch",
                "logging.getLogger", "def main", "__init__", "json.loads", "subprocess.run", "class User",
                "def test_login", "os.environ", "requests.get", "def load_model", "FIXME", "return None",
                "@dataclass", "open(path)", "yield from", "except KeyError", "def __repr__", "sys.exit"]
TEST_PATTERNS = ["tests/test_api.py", "test_login", "test_parser", "tests/unit", "test_cache*", "tests/integration",
                 "test_models.py", "test_cli", "tests/test_utils.py", "test_http*", "test_config", "tests"]
PACKAGES = ["requests", "numpy", "flask", "pandas", "pytest", "rich", "httpx", "django", "click", "pyyaml",
            "scipy", "black", "ruff", "fastapi", "sqlalchemy", "attrs", "tqdm", "pillow"]
VERSIONS = ["1.0.0", "2.31.0", "3.0.0", "1.26.4", "0.27.0", "8.1.7", "2.2.1", "4.2.11", "0.110.0", "13.7.1"]
SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "META", "IBM", "INTC", "ORCL", "SAP", "AMD"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "INR"]
WEB_QUERIES = ["python asyncio tutorial", "best pizza in Naples", "how to center a div", "rust vs go performance",
               "history of the printing press", "mixture of experts models", "sourdough bread recipe",
               "python type hints", "tallest mountains in Europe", "how does git rebase work",
               "linux file permissions", "solar panel efficiency", "unicode normalization forms"]
PEOPLE = [("Ada Lovelace", "ada"), ("Alan Turing", "alan"), ("Grace Hopper", "grace"), ("Linus Torvalds", "linus"),
          ("Guido van Rossum", "guido"), ("Margaret Hamilton", "margaret"), ("Ken Thompson", "ken"),
          ("Barbara Liskov", "barbara"), ("Donald Knuth", "don"), ("Frances Allen", "fran")]
EMAILS = ["alice@example.com", "bob@example.org", "team@acme.io", "carol@example.net", "dev@startup.dev",
          "ops@example.com", "dave@mail.example", "support@shop.example"]
SUBJECTS = ["Meeting", "Release notes", "Lunch", "Build broken", "Report", "Welcome", "Maintenance", "Review"]
ISSUE_TITLES = ["Crash when the config file is missing", "Add a dark mode", "Login fails with long passwords",
                "Slow startup on Windows", "Typo in the README", "Support Python 3.13", "Memory leak in the cache",
                "Broken link in the docs", "Timeout when uploading large files"]
LABELS = ["bug", "enhancement", "documentation", "performance", "good first issue", "question"]
PHRASES = {  # phrase -> {language: translation}
    "hello": {"French": "bonjour", "Spanish": "hola", "German": "hallo", "Italian": "ciao"},
    "thank you": {"French": "merci", "Spanish": "gracias", "German": "danke", "Italian": "grazie"},
    "good morning": {"French": "bonjour", "Spanish": "buenos días", "German": "guten Morgen",
                     "Italian": "buongiorno"},
    "good night": {"French": "bonne nuit", "Spanish": "buenas noches", "German": "gute Nacht",
                   "Italian": "buona notte"},
    "see you tomorrow": {"French": "à demain", "Spanish": "hasta mañana", "German": "bis morgen",
                         "Italian": "a domani"},
    "where is the station": {"French": "où est la gare", "Spanish": "dónde está la estación",
                             "German": "wo ist der Bahnhof", "Italian": "dov'è la stazione"},
}
LANGUAGES = ["French", "Spanish", "German", "Italian"]
SNIPPETS = {  # code -> what it prints
    "print(2 ** 10)": "1024", "print(sum(range(10)))": "45", "print('abc'.upper())": "ABC",
    "print(len('hello'))": "5", "print(sorted([3, 1, 2]))": "[1, 2, 3]", "print(7 // 2, 7 % 2)": "3 1",
    "print(list(range(5)))": "[0, 1, 2, 3, 4]", "print(max([4, 9, 2]))": "9", "print('a-b-c'.split('-'))":
    "['a', 'b', 'c']", "print(round(3.14159, 2))": "3.14", "print(10 / 4)": "2.5", "print(', '.join(['x', 'y']))":
    "x, y",
}
URLS = ["https://example.com/api/status", "https://api.example.org/v1/users", "https://example.net/health",
        "https://httpbin.org/get", "https://example.com/data.json", "https://status.example.io/ping"]
FILE_CONTENTS = [
    "import os\n\n\ndef main():\n    print(os.getcwd())\n",
    "# Project\n\nA small example project.\n",
    "name: app\nversion: 1.2.0\ndebug: false\n",
    "def add(a, b):\n    return a + b\n",
    "id,name\n1,Ada\n2,Alan\n",
    "[project]\nname = \"demo\"\nversion = \"0.1.0\"\n",
]
DIR_ENTRIES = ["__init__.py", "main.py", "utils.py", "config.py", "models.py", "README.md", "tests", "data",
               "cli.py", "server.py", "cache.py", "setup.cfg"]
COMMIT_MESSAGES = ["Fix the login redirect", "Add tests for the parser", "Update dependencies", "Refactor the cache",
                   "Improve error messages", "Bump version to 1.2.0", "Remove dead code", "Speed up startup"]
TIMER_LABELS = ["tea", "focus", "pasta", "break", "laundry", "standup"]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant with access to tools.",
    "You are a coding assistant. Use the tools when they help.",
    "You are a helpful assistant that writes Python code.",
    "Answer briefly. Call a tool when you need one.",
]

# Plain questions with answers: asked while tools are available, answered without a call.
PY_QA = [
    ("How do I reverse a list in Python?",
     "Use slicing, which returns a new list, or `reverse()`, which reverses in place:\n\n```python\n"
     "items = [1, 2, 3]\nprint(items[::-1])\nitems.reverse()\n```"),
    ("How can I read a file line by line in Python?",
     "Iterate over the file object:\n\n```python\nwith open(\"data.txt\") as f:\n    for line in f:\n"
     "        print(line.rstrip())\n```"),
    ("What is the difference between a list and a tuple?",
     "A list is mutable: you can add, remove and change items. A tuple is immutable, so it can be used "
     "as a dictionary key."),
    ("How do I check if a key is in a dictionary?",
     "Use the `in` operator:\n\n```python\nif \"name\" in person:\n    print(person[\"name\"])\n```"),
    ("Write a Python function that returns the square of a number.",
     "```python\ndef square(x):\n    return x * x\n```"),
    ("Write a Python function that checks whether a number is even.",
     "```python\ndef is_even(n):\n    return n % 2 == 0\n```"),
    ("How do I remove duplicates from a list while keeping the order?",
     "Use `dict.fromkeys`:\n\n```python\nitems = [3, 1, 3, 2, 1]\nunique = list(dict.fromkeys(items))\n```"),
    ("What does `enumerate` do?",
     "It yields pairs of index and item:\n\n```python\nfor i, name in enumerate([\"a\", \"b\"]):\n"
     "    print(i, name)\n```"),
    ("How do I sort a list of dictionaries by a key?",
     "Pass a key function to `sorted`:\n\n```python\npeople.sort(key=lambda p: p[\"age\"])\n```"),
    ("Write a Python function that returns the factorial of a number.",
     "```python\ndef factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n"
     "    return result\n```"),
    ("How do I join a list of strings with commas?",
     "Use `str.join`:\n\n```python\nprint(\", \".join([\"a\", \"b\", \"c\"]))\n```"),
    ("What is a list comprehension?",
     "A compact way to build a list:\n\n```python\nsquares = [x * x for x in range(10)]\n```"),
    ("Write a Python function that counts the vowels in a string.",
     "```python\ndef count_vowels(s):\n    return sum(1 for c in s.lower() if c in \"aeiou\")\n```"),
    ("How do I get the current working directory?",
     "Use `os.getcwd()`:\n\n```python\nimport os\nprint(os.getcwd())\n```"),
    ("How do I parse a JSON string in Python?",
     "Use `json.loads`:\n\n```python\nimport json\ndata = json.loads('{\"a\": 1}')\nprint(data[\"a\"])\n```"),
    ("Write a Python function that returns the largest item of a list.",
     "```python\ndef largest(items):\n    best = items[0]\n    for x in items[1:]:\n        if x > best:\n"
     "            best = x\n    return best\n```"),
    ("How do I convert a string to an integer?",
     "Use `int()`: `int(\"42\")` returns `42`. It raises `ValueError` if the string is not a number."),
    ("What does the `with` statement do?",
     "It runs a block inside a context manager, which sets things up and always cleans up, for example "
     "closing a file even if an exception is raised."),
    ("Write a Python function that reverses a string.",
     "```python\ndef reverse(s):\n    return s[::-1]\n```"),
    ("How do I merge two dictionaries?",
     "Use the `|` operator (Python 3.9+) or unpacking:\n\n```python\nmerged = a | b\nmerged = {**a, **b}\n```"),
]
SMALL_TALK = [
    ("Hi!", "Hello! How can I help you?"),
    ("Thanks, that's all.", "You're welcome!"),
    ("Who are you?", "I am spill-tiny, a small assistant that can write Python and call tools."),
    ("Hello, can you help me?", "Of course. What do you need?"),
]


# ----------------------------------------------------------------------------------------------
# Tools: schema + a maker that returns (user request, arguments, result, answer)
# ----------------------------------------------------------------------------------------------

def _s(desc=None, enum=None):
    d = {"type": "string"}
    if desc:
        d["description"] = desc
    if enum:
        d["enum"] = list(enum)
    return d


def _t(typ, desc=None, **extra):
    d = {"type": typ}
    if desc:
        d["description"] = desc
    d.update(extra)
    return d


def _j(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


class Tool:
    def __init__(self, name, description, params, required, maker):
        self.name = name
        self.params = params  # [(name, schema)] in order
        self.required = required
        self.schema = {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": {n: s for n, s in params}, "required": list(required)}}}
        self.maker = maker

    def make(self, rng):
        user, args, result, answer = self.maker(rng)
        order = [n for n, _ in self.params]
        unknown = [k for k in args if k not in order]
        missing = [k for k in self.required if k not in args]
        if unknown or missing:
            raise AssertionError(f"{self.name}: bad arguments {args}")
        args = {k: args[k] for k in order if k in args}  # schema order
        return user, args, result, answer


def _weather(rng):
    city = rng.choice(CITIES)
    cond = rng.choice(CONDITIONS)
    r = rng.random()
    if r < 0.3:
        unit = rng.choice(["celsius", "fahrenheit"])
        temp = rng.randint(20, 95) if unit == "fahrenheit" else rng.randint(-8, 35)
        user = rng.choice([f"What's the weather in {city} in {unit}?",
                           f"Tell me the temperature in {city} in degrees {unit}.",
                           f"How hot is it in {city}? Give it in {unit}, please."])
        args = {"city": city, "unit": unit}
    else:
        unit = "celsius"
        temp = rng.randint(-8, 35)
        user = rng.choice([f"What's the weather like in {city}?", f"What is the weather in {city} right now?",
                           f"Is it raining in {city}?", f"How warm is it in {city} today?",
                           f"Check the weather for {city}.", f"weather in {city}"])
        args = {"city": city}
    result = _j({"city": city, "temperature": temp, "unit": unit, "condition": cond})
    answer = f"It is {temp} degrees {unit.capitalize()} and {cond} in {city}."
    return user, args, result, answer


def _time(rng):
    tz = rng.choice(TIMEZONES)
    hh, mm = rng.randint(0, 23), rng.randint(0, 59)
    date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    user = rng.choice([f"What time is it in {tz}?", f"Get the current time for the {tz} timezone.",
                       f"What's the local time in {tz}?", f"time in {tz}?"])
    result = _j({"timezone": tz, "time": f"{hh:02d}:{mm:02d}", "date": date})
    return user, {"timezone": tz}, result, f"It is {hh:02d}:{mm:02d} on {date} in {tz}."


def _expression(rng):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
    form = rng.randrange(6)
    if form == 0:
        e = f"{a} * {b}"
    elif form == 1:
        e = f"{a} + {b} * {c}"
    elif form == 2:
        e = f"({a} + {b}) * {c}"
    elif form == 3:
        e = f"{c} ** {rng.randint(2, 6)}"
    elif form == 4:
        e = f"{a * c} / {c}"
    else:
        e = f"{a} - {b}"
    value = eval(e, {"__builtins__": {}}, {})  # noqa: S307 - our own arithmetic strings
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return e, value


def _calculate(rng):
    e, value = _expression(rng)
    user = rng.choice([f"What is {e}?", f"Calculate {e}.", f"Can you compute {e} for me?", f"Evaluate {e}",
                       f"How much is {e}?"])
    return user, {"expression": e}, _j({"result": value}), f"{e} = {value}."


def _search_code(rng):
    q = rng.choice(CODE_QUERIES)
    files = rng.sample([f for f in FILES if f.endswith(".py")], 2)
    if rng.random() < 0.4:
        path = rng.choice(DIRS)
        user = rng.choice([f"Search the code in {path} for \"{q}\".", f"Find \"{q}\" in {path}.",
                           f"Where is `{q}` used under {path}?"])
        args = {"query": q, "path": path}
    else:
        user = rng.choice([f"Search the codebase for \"{q}\".", f"Find where `{q}` appears in the code.",
                           f"grep the repository for \"{q}\"", f"Which files contain `{q}`?"])
        args = {"query": q}
    n = rng.randint(1, 2)
    matches = [{"file": files[i], "line": rng.randint(1, 400)} for i in range(n)]
    result = _j({"matches": matches})
    where = " and ".join(f"{m['file']} line {m['line']}" for m in matches)
    return user, args, result, f"`{q}` appears in {where}."


def _read_file(rng):
    path = rng.choice(FILES)
    content = rng.choice(FILE_CONTENTS)
    if rng.random() < 0.3:
        k = rng.choice([5, 10, 20, 50, 100])
        user = rng.choice([f"Show me the first {k} lines of {path}.", f"Read {k} lines from {path}."])
        args = {"path": path, "max_lines": k}
    else:
        user = rng.choice([f"Read the file {path}.", f"Show me the contents of {path}.", f"What's in {path}?",
                           f"Open {path} and show it to me.", f"cat {path}"])
        args = {"path": path}
    first = content.splitlines()[0]
    answer = f"{path} has {len(content.splitlines())} lines; the first one is `{first}`."
    return user, args, content, answer


def _write_file(rng):
    path = rng.choice(["notes.txt", "todo.md", "out/result.txt", "hello.py", "data/input.csv", "NOTES.md"])
    content = rng.choice(["hello world", "print('hi')", "buy milk", "a,b\n1,2", "TODO: write tests", "done"])
    user = rng.choice([f"Write \"{content}\" to {path}.", f"Create the file {path} with the content \"{content}\".",
                       f"Save \"{content}\" in {path}."])
    n = len(content.encode("utf-8"))
    return user, {"path": path, "content": content}, _j({"ok": True, "bytes": n}), f"Wrote {n} bytes to {path}."


def _list_directory(rng):
    path = rng.choice(DIRS)
    entries = sorted(rng.sample(DIR_ENTRIES, rng.randint(2, 5)))
    user = rng.choice([f"List the files in {path}.", f"What's in the {path} directory?", f"ls {path}",
                       f"Show me the contents of the folder {path}."])
    return user, {"path": path}, _j({"entries": entries}), f"{path} contains {len(entries)} entries: " + \
        ", ".join(entries) + "."


def _run_tests(rng):
    pat = rng.choice(TEST_PATTERNS)
    user = rng.choice([f"Run the tests matching {pat}.", f"Run {pat} tests.", f"Please run the tests in {pat}.",
                       f"pytest {pat}"])
    p, f = rng.randint(1, 60), rng.choice([0, 0, 0, 1, 2, 3])
    answer = f"All {p} tests passed." if f == 0 else f"{p} tests passed and {f} failed."
    return user, {"pattern": pat}, _j({"passed": p, "failed": f}), answer


def _git_diff(rng):
    k = rng.randint(1, 9)
    if rng.random() < 0.7:
        path = rng.choice(FILES)
        user = rng.choice([f"Show me the git diff for {path}.", f"What changed in {path}?",
                           f"git diff {path}", f"Show the uncommitted changes to {path}."])
        args = {"file": path}
        result = f"--- a/{path}\n+++ b/{path}\n@@ -1,{k} +1,{k} @@"
        answer = f"{path} has uncommitted changes in {k} lines."
    else:
        user = rng.choice(["Show me the git diff.", "What changed in the working tree?", "git diff",
                           "Show all uncommitted changes."])
        args = {}
        result = f"{k} files changed"
        answer = f"{k} files have uncommitted changes."
    return user, args, result, answer


def _git_log(rng):
    n = rng.randint(1, 10)
    user = rng.choice([f"Show the last {n} commits.", f"What are the {n} most recent commits?", f"git log -n {n}"])
    h = "".join(rng.choice("0123456789abcdef") for _ in range(7))
    msg = rng.choice(COMMIT_MESSAGES)
    return user, {"max_count": n}, _j([{"hash": h, "message": msg}]), f"The latest commit is {h}: {msg}."


def _translate(rng):
    phrase = rng.choice(list(PHRASES))
    lang = rng.choice(LANGUAGES)
    user = rng.choice([f"Translate \"{phrase}\" into {lang}.", f"How do you say \"{phrase}\" in {lang}?",
                       f"What is \"{phrase}\" in {lang}?"])
    tr = PHRASES[phrase][lang]
    return user, {"text": phrase, "target_language": lang}, _j({"translation": tr}), \
        f"\"{phrase}\" in {lang} is \"{tr}\"."


def _send_email(rng):
    to, subj = rng.choice(EMAILS), rng.choice(SUBJECTS)
    user = rng.choice([f"Send an email to {to} with the subject \"{subj}\".", f"Email {to}: subject \"{subj}\"",
                       f"Write to {to} about \"{subj}\"."])
    mid = f"msg-{rng.randint(1000, 9999)}"
    return user, {"to": to, "subject": subj}, _j({"status": "sent", "id": mid}), \
        f"The email to {to} was sent ({mid})."


def _create_issue(rng):
    title = rng.choice(ISSUE_TITLES)
    r = rng.random()
    if r < 0.35:
        labels = [rng.choice(LABELS)]
        user = f"Open an issue titled \"{title}\" with the label {labels[0]}."
    elif r < 0.5:
        labels = rng.sample(LABELS, 2)
        user = f"Create an issue \"{title}\" labelled {labels[0]} and {labels[1]}."
    else:
        labels = None
        user = rng.choice([f"Open an issue titled \"{title}\".", f"File a bug: \"{title}\"",
                           f"Create a new issue called \"{title}\"."])
    args = {"title": title}
    if labels:
        args["labels"] = labels
    n = rng.randint(10, 999)
    return user, args, _j({"number": n, "url": f"https://github.com/acme/app/issues/{n}"}), f"Created issue #{n}."


def _stock(rng):
    s = rng.choice(SYMBOLS)
    price = round(rng.uniform(20, 900), 2)
    user = rng.choice([f"What's the stock price of {s}?", f"How much is {s} trading at?", f"Get the price of {s}.",
                       f"{s} share price?"])
    return user, {"symbol": s}, _j({"symbol": s, "price": price, "currency": "USD"}), \
        f"{s} is trading at {price} USD."


def _convert(rng):
    a, b = rng.sample(CURRENCIES, 2)
    amount = rng.choice([rng.randint(1, 500), rng.choice([10, 20, 50, 100, 250, 1000]),
                         round(rng.uniform(1, 200), 2)])
    out = round(amount * rng.uniform(0.5, 1.6), 2)
    user = rng.choice([f"Convert {amount} {a} to {b}.", f"How much is {amount} {a} in {b}?",
                       f"What is {amount} {a} in {b}?"])
    return user, {"amount": amount, "from_currency": a, "to_currency": b}, _j({"amount": out, "currency": b}), \
        f"{amount} {a} is {out} {b}."


def _search_web(rng):
    q = rng.choice(WEB_QUERIES)
    if rng.random() < 0.3:
        n = rng.randint(2, 10)
        user = rng.choice([f"Find {n} web results about {q}.", f"Search the web for \"{q}\" and give me {n} results."])
        args = {"query": q, "num_results": n}
    else:
        user = rng.choice([f"Search the web for {q}.", f"Look up \"{q}\" online.", f"google {q}"])
        args = {"query": q}
    slug = re.sub(r"[^a-z0-9]+", "-", q.lower()).strip("-")
    title = q.capitalize()
    url = f"https://example.com/{slug}"
    return user, args, _j({"results": [{"title": title, "url": url}]}), f"The top result is \"{title}\" ({url})."


def _timer(rng):
    m = rng.choice([1, 2, 3, 5, 10, 15, 20, 25, 30, 45, 60, 90])
    if rng.random() < 0.4:
        label = rng.choice(TIMER_LABELS)
        user = rng.choice([f"Set a {m} minute timer called {label}.", f"Start a timer for {m} minutes named {label}."])
        args = {"minutes": m, "label": label}
    else:
        user = rng.choice([f"Set a timer for {m} minutes.", f"Remind me in {m} minutes.", f"timer {m} min"])
        args = {"minutes": m}
    end = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return user, args, _j({"ok": True, "ends_at": end}), f"The timer is set for {m} minutes; it ends at {end}."


def _install(rng):
    pkg = rng.choice(PACKAGES)
    if rng.random() < 0.35:
        ver = rng.choice(VERSIONS)
        user = rng.choice([f"Install {pkg} version {ver}.", f"pip install {pkg}=={ver}"])
        args = {"name": pkg, "version": ver}
        result = f"Successfully installed {pkg}-{ver}"
        answer = f"{pkg} {ver} is installed."
    else:
        user = rng.choice([f"Install {pkg}.", f"Please install the {pkg} package.", f"pip install {pkg}"])
        args = {"name": pkg}
        result = f"Successfully installed {pkg}"
        answer = f"{pkg} is installed."
    return user, args, result, answer


def _run_python(rng):
    code = rng.choice(list(SNIPPETS))
    out = SNIPPETS[code]
    user = rng.choice([f"Run this Python code: {code}", f"Execute `{code}` and tell me the output.",
                       f"What does `{code}` print? Run it."])
    return user, {"code": code}, out, f"The output is `{out}`."


def _get_user(rng):
    uid = rng.randint(1, 9999)
    name, handle = rng.choice(PEOPLE)
    user = rng.choice([f"Look up user {uid}.", f"Who is user #{uid}?", f"Get the details of the user with id {uid}."])
    email = f"{handle}@example.com"
    return user, {"user_id": uid}, _j({"id": uid, "name": name, "email": email}), \
        f"User {uid} is {name} ({email})."


def _http_get(rng):
    url = rng.choice(URLS)
    status = rng.choice([200, 200, 200, 404, 500])
    user = rng.choice([f"Fetch {url}", f"Send a GET request to {url}.", f"What does {url} return?"])
    body = "{\"status\": \"ok\"}" if status == 200 else ""
    answer = f"{url} returned status {status}" + (f" with the body {body}." if body else ".")
    return user, {"url": url}, _j({"status": status, "body": body}), answer


TOOLS = [
    Tool("get_weather", "Get the current weather in a city.",
         [("city", _s("City name")), ("unit", _s(enum=["celsius", "fahrenheit"]))], ["city"], _weather),
    Tool("get_time", "Get the current time in a timezone.", [("timezone", _s("IANA timezone name"))], ["timezone"],
         _time),
    Tool("calculate", "Evaluate an arithmetic expression.", [("expression", _s())], ["expression"], _calculate),
    Tool("search_code", "Search the source code for a string.",
         [("query", _s()), ("path", _s("Directory to search"))], ["query"], _search_code),
    Tool("read_file", "Read a text file.", [("path", _s()), ("max_lines", _t("integer"))], ["path"], _read_file),
    Tool("write_file", "Write text to a file.", [("path", _s()), ("content", _s())], ["path", "content"], _write_file),
    Tool("list_directory", "List the files in a directory.", [("path", _s())], ["path"], _list_directory),
    Tool("run_tests", "Run the test suite, or the tests matching a pattern.", [("pattern", _s())], ["pattern"],
         _run_tests),
    Tool("git_diff", "Show uncommitted changes.", [("file", _s("Limit the diff to this file"))], [], _git_diff),
    Tool("git_log", "Show recent commits.", [("max_count", _t("integer"))], ["max_count"], _git_log),
    Tool("translate_text", "Translate text into another language.",
         [("text", _s()), ("target_language", _s())], ["text", "target_language"], _translate),
    Tool("send_email", "Send an email.", [("to", _s()), ("subject", _s())], ["to", "subject"], _send_email),
    Tool("create_issue", "Open an issue in the bug tracker.",
         [("title", _s()), ("labels", _t("array", items={"type": "string"}))], ["title"], _create_issue),
    Tool("get_stock_price", "Get the latest stock price for a ticker symbol.", [("symbol", _s())], ["symbol"],
         _stock),
    Tool("convert_currency", "Convert an amount between currencies.",
         [("amount", _t("number")), ("from_currency", _s()), ("to_currency", _s())],
         ["amount", "from_currency", "to_currency"], _convert),
    Tool("search_web", "Search the web.", [("query", _s()), ("num_results", _t("integer"))], ["query"], _search_web),
    Tool("set_timer", "Start a countdown timer.", [("minutes", _t("integer")), ("label", _s())], ["minutes"], _timer),
    Tool("install_package", "Install a Python package with pip.", [("name", _s()), ("version", _s())], ["name"],
         _install),
    Tool("run_python", "Run a Python snippet and return its output.", [("code", _s())], ["code"], _run_python),
    Tool("get_user", "Look up a user by id.", [("user_id", _t("integer"))], ["user_id"], _get_user),
    Tool("http_get", "Send an HTTP GET request.", [("url", _s())], ["url"], _http_get),
]
TOOL_BY_NAME = {t.name: t for t in TOOLS}

# Whole prompts (system + tools + user, rendered) stay below about this many characters, about 400
# tokens with spill-tiny's tokenizer (3.2 characters per token here): the model trains on 512-token
# windows, so prompt + call must fit in 512 positions.
MAX_PROMPT_CHARS = 1300
_TEMPLATE_OVERHEAD = 420  # the fixed text the template adds around the tools and turns


# ----------------------------------------------------------------------------------------------
# Conversations
# ----------------------------------------------------------------------------------------------

def _pick_tools(rng, target, budget):
    """1-4 tools including target (if any), in random order, within a character budget."""
    k = rng.choice([1, 2, 2, 3, 3, 4])
    others = [t for t in TOOLS if t is not target]
    chosen = rng.sample(others, k - (1 if target else 0)) if k > (1 if target else 0) else []
    if target is not None:
        chosen.append(target)
    rng.shuffle(chosen)

    def size(ts):
        return sum(len(_j(t.schema)) + 1 for t in ts)

    while size(chosen) > budget and len(chosen) > 1:
        drop = [t for t in chosen if t is not target]
        chosen.remove(drop[0])
    return chosen


def _call_message(rng, name, args):
    """The assistant message with one call, in one of the forms clients send (all render alike)."""
    r = rng.random()
    if r < 0.7:
        call = {"type": "function", "function": {"name": name, "arguments": args}}
    elif r < 0.85:
        call = {"type": "function", "function": {"name": name, "arguments": _j(args)}}
    else:
        call = {"name": name, "arguments": args}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def make_call_prompt(rng):
    """(messages up to the user turn, tools, expected name, expected arguments, result, answer)."""
    target = rng.choice(TOOLS)
    user, args, result, answer = target.make(rng)
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    msgs.append({"role": "user", "content": user})
    budget = MAX_PROMPT_CHARS - _TEMPLATE_OVERHEAD - sum(len(m["content"]) for m in msgs)
    tools = _pick_tools(rng, target, budget)
    return msgs, [t.schema for t in tools], target.name, args, result, answer


def prompt_key(messages, tools):
    return _j([messages, [t["function"]["name"] for t in tools]])


def generate(n: int, seed: int, python_examples=None, continue_frac: float = 0.6, no_call_frac: float = 0.2):
    """n conversations: [{"messages", "tools", "kind"}], kind in call / call+answer / no_call.
    python_examples: optional [(instruction, code)] to ask (with tools present) and answer with code."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < no_call_frac:
            msgs = []
            if rng.random() < 0.5:
                msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
            r = rng.random()
            if python_examples and r < 0.45:
                instr, code = python_examples[rng.randrange(len(python_examples))][:2]
                q, a = instr, f"```python\n{code}\n```"
            elif r < 0.9:
                q, a = rng.choice(PY_QA)
            else:
                q, a = rng.choice(SMALL_TALK)
            msgs.append({"role": "user", "content": q})
            budget = MAX_PROMPT_CHARS - _TEMPLATE_OVERHEAD - sum(len(m["content"]) for m in msgs)
            tools = [t.schema for t in _pick_tools(rng, None, max(budget, 300))]
            msgs.append({"role": "assistant", "content": a})
            out.append({"messages": msgs, "tools": tools, "kind": "no_call"})
            continue
        msgs, tools, name, args, result, answer = make_call_prompt(rng)
        key = prompt_key(msgs, tools)
        msgs.append(_call_message(rng, name, args))
        kind = "call"
        if rng.random() < continue_frac:
            msgs.append({"role": "tool", "content": result})
            msgs.append({"role": "assistant", "content": answer})
            kind = "call+answer"
        out.append({"messages": msgs, "tools": tools, "kind": kind, "key": key})
    return out


def eval_prompts(n: int, seed: int, exclude=()):
    """n held-out call prompts (a different seed from training; prompts seen in training skipped):
    [{"messages", "tools", "name", "arguments"}]."""
    rng = random.Random(seed)
    exclude = set(exclude)
    out, seen = [], set()
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        msgs, tools, name, args, _result, _answer = make_call_prompt(rng)
        key = prompt_key(msgs, tools)
        if key in exclude or key in seen:
            continue
        seen.add(key)
        out.append({"messages": msgs, "tools": tools, "name": name, "arguments": args})
    return out


def no_call_prompts(n: int, seed: int):
    """n plain Python questions asked with tools present: [{"messages", "tools"}] (no call expected)."""
    rng = random.Random(seed ^ 0x5eed)
    out = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        msgs.append({"role": "user", "content": rng.choice(PY_QA)[0]})
        budget = MAX_PROMPT_CHARS - _TEMPLATE_OVERHEAD - sum(len(m["content"]) for m in msgs)
        out.append({"messages": msgs, "tools": [t.schema for t in _pick_tools(rng, None, max(budget, 300))]})
    return out


def expected_call_text(name, args) -> str:
    """What the model should write for a call (the template's rendering of the assistant turn)."""
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + _j(args) + "}\n</tool_call>"


_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_first_call(text: str):
    """The first <tool_call>{json}</tool_call> in text -> (name, arguments dict), or None."""
    m = _CALL_RE.search(text)
    if not m:
        return None
    try:
        obj = json.loads(m.group(1).strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], args


def score_output(text: str, name: str, args: dict) -> dict:
    """valid: a parseable call; name: right tool; exact: right tool and exactly the right arguments
    (same keys, values and JSON types)."""
    got = parse_first_call(text)
    if got is None:
        return {"valid": False, "name": False, "exact": False}
    same_name = got[0] == name
    same_args = json.dumps(got[1], sort_keys=True) == json.dumps(args, sort_keys=True)
    return {"valid": True, "name": same_name, "exact": same_name and same_args}


# ----------------------------------------------------------------------------------------------
# A plain-Python statement of the chat template's layout, to check the Jinja template against
# ----------------------------------------------------------------------------------------------

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")


def reference_render(messages, tools=None, add_generation_prompt=False) -> str:
    out = []
    first_system = bool(messages) and messages[0].get("role") == "system"
    if tools:
        out.append("<|im_start|>system\n")
        if first_system:
            out.append(messages[0]["content"] + "\n\n")
        out.append(TOOLS_HEADER)
        for t in tools:
            out.append("\n" + _j(t))
        out.append(TOOLS_FOOTER)
    elif first_system:
        out.append("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
    in_tool = False
    for i, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content")
        if role == "tool":
            out.append("\n" if in_tool else "<|im_start|>user\n")
            in_tool = True
            out.append("<tool_response>\n" + (content if isinstance(content, str) else _j(content)) +
                       "\n</tool_response>")
            continue
        if in_tool:
            out.append("<|im_end|>\n")
            in_tool = False
        if role == "assistant":
            text = content if isinstance(content, str) else ""
            out.append("<|im_start|>assistant\n" + text)
            sep = "\n" if text else ""
            for call in m.get("tool_calls") or []:
                fn = call["function"] if isinstance(call.get("function"), dict) else call
                a = fn.get("arguments")
                a = a if isinstance(a, str) else (_j(a) if isinstance(a, dict) else "{}")
                out.append(sep + "<tool_call>\n{\"name\": \"" + fn["name"] + "\", \"arguments\": " + a +
                           "}\n</tool_call>")
                sep = "\n"
            out.append("<|im_end|>\n")
        elif not (role == "system" and i == 0):
            out.append("<|im_start|>" + role + "\n" + (content if isinstance(content, str) else "") + "<|im_end|>\n")
    if in_tool:
        out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def template_cases():
    """Conversations that reach every branch of the template: (messages, tools, add_generation_prompt)."""
    w = TOOL_BY_NAME["get_weather"].schema
    c = TOOL_BY_NAME["calculate"].schema
    return [
        ([{"role": "user", "content": "Write a Python function that reverses a string."}], None, True),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "Hello!"}], None, False),
        ([{"role": "user", "content": "weather in Oslo"}], [w, c], True),
        ([{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "weather in Oslo"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 3}"},
          {"role": "assistant", "content": "It is 3 degrees in Oslo."},
          {"role": "user", "content": "And 2 + 2?"}], [w, c], True),
        ([{"role": "user", "content": "weather in Oslo and Rome, and 6 * 7"},
          {"role": "assistant", "content": "Let me check.", "tool_calls": [
              {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
              {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}},
              {"name": "calculate", "arguments": {"expression": "6 * 7"}}]},
          {"role": "tool", "content": "{\"temperature\": 3}"}, {"role": "tool", "content": "sunny, 21"},
          {"role": "tool", "content": {"result": 42}}], [w, c], True),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
          {"role": "system", "content": "late system message"}, {"role": "user", "content": "ünïcödé <&>"}],
         [c], False),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
            {"name": "git_diff", "arguments": {}}]}, {"role": "tool", "content": "no changes"}], None, False),
    ]


def render_fn():
    try:
        from spill_tokenizer import render_chat
    except ImportError:
        return None
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return None
    return render_chat


if __name__ == "__main__":
    import os
    import sys
    import time

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    render = render_fn()
    convs = generate(2000, 1234)
    kinds = {}
    for c in convs:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    print(f"{len(TOOLS)} tools; kinds {kinds}")
    for c in convs[:6]:
        text = render(c["messages"], False, c["tools"]) if render else reference_render(c["messages"], c["tools"])
        print("=" * 80)
        print(text)
    if render is None:
        print("jinja2 not available: template not checked")
        sys.exit(0)
    for msgs, tools, gen in template_cases():
        a, b = render(msgs, gen, tools), reference_render(msgs, tools, gen)
        assert a == b, (a, b)
    t0 = time.time()
    texts = [render(c["messages"], False, c["tools"]) for c in convs]
    dt = time.time() - t0
    for c, t in zip(convs, texts):
        assert t == reference_render(c["messages"], c["tools"], False)
    ev = eval_prompts(50, 4321, exclude={c["key"] for c in convs if "key" in c})
    plens = [len(render(e["messages"], True, e["tools"])) for e in ev]
    print(f"template == reference on {len(template_cases())} cases and {len(convs)} conversations; "
          f"{dt / len(convs) * 1e6:.0f} us per rendering; conversation chars mean "
          f"{sum(map(len, texts)) / len(texts):.0f} max {max(map(len, texts))}; eval prompt chars max {max(plens)}")
