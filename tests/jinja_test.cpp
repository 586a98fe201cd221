// spill::jinja::Template against Python's jinja2: every expected string below was produced by
// jinja2 3.1.6 in transformers' chat-template environment (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, {% generation %}, tojson = json.dumps(ensure_ascii=
// False), raise_exception, strftime_now pinned to 2024-07-26 13:05:09), i.e. what
// tools/fixtures/make_chat_template_fixtures.py builds when transformers is absent. Errors are
// "template:<line>: <jinja2 exception class>: <str(exception)>" with jinja2's line number.
#include "text/jinja.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/error.h"

namespace spill::jinja {
namespace {

struct RenderCase {
  const char* source;
  const char* variables;
  const char* expected;
};

struct ErrorCase {
  const char* source;
  const char* variables;
  const char* expected_error;
};

RenderOptions pinned_now() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 13;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_wday = 5;
  tm.tm_yday = 207;
  RenderOptions options;
  options.now = tm;
  return options;
}

std::string render(const char* source, const char* variables) {
  return Template(source).render(nlohmann::ordered_json::parse(variables), pinned_now());
}

template <size_t N>
void check_all(const RenderCase (&cases)[N]) {
  for (const RenderCase& c : cases) {
    SCOPED_TRACE(c.source);
    try {
      EXPECT_EQ(render(c.source, c.variables), c.expected);
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

const RenderCase kExpressions[] = {
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} "
     "{{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}",
     "{}", "7 9 3 -4 1 2 3.5 1024 0.5 64"},
    {"{{ 10.5 // 3 }} {{ 10 % -3 }} {{ 5.5 % 2 }} {{ -5.5 % 2 }} {{ 9 ** 0.5 }} {{ -2 ** 2 }} {{ (-2) ** 2 }}", "{}",
     "3.0 -2 1.5 0.5 3.0 4 4"},
    {"{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' in 'cat' }} {{ 2 not "
     "in [1,2] }} {{ 'k' in {'k':1} }}",
     "{}", "True True True True False True False True"},
    {"{{ 1 == True }} {{ [1] == [1.0] }} {{ {'a':1} == {'a':1} }} {{ (1,) == [1] }} {{ none == none }} {{ x == none }}",
     "{}", "True True True False True False"},
    {"{{ 'a' ~ 1 ~ none ~ true }} {{ x ~ 'y' }}", "{}", "a1NoneTrue y"},
    {"{{ not 1 }} {{ not 0 and 1 }} {{ 0 or 'x' }} {{ '' or [] }} {{ 1 and 2 }} {{ none and 1 }} {{ (param.required or "
     "[])|length }}",
     "{\"param\": {}}", "False 1 x [] 2 None 0"},
    {"{{ -1|abs }} {{ - 2 + 3 }} {{ +3 }} {{ -(3) }} {{ -(x|default(1)) }} {{ -1|abs }}", "{}", "1 1 3 -3 -1 1"},
    {"{{ 'x' if true else 'y' }} {{ 'x' if false else 'y' }} [{{ 'x' if false }}] {{ 'a' if 'b' in 'abc' and not false "
     "else 'c' }}",
     "{}", "x y [] a"},
    {"{{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ 'x' * -1 }} {{ true + 1 }} {{ 1.5 + 1 }} {{ [1] + [2] }} {{ (1,) "
     "+ (2,) }}",
     "{}", "ababab ababab [1, 1]  2 2.5 [1, 2] (1, 2)"},
    {"{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ 2E-3 }} {{ 'a' 'b' }}", "{}",
     "1000 31 15 5 1500.0 0.002 ab"},
    {"{{ 'a\\nb\\t\\x41\\u00e9\\U0001F600\\\\ \\q' }} {{ \"it's\" }} {{ 'say \"hi\"' }}", "{}",
     "a\nb\tAé😀\\ \\q it's say \"hi\""},
    {"{{ {'a': {'b': 1}}['a'] }} {{ {'a': {'b': 1}}.a.b }}", "{}", "{'b': 1} 1"},
    {"{{ messages[0].role }}{{ messages[0]['content'] }}{{ messages.0.role }}{{ messages[-1].role }}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "userhiuseruser"},
    {"{{ d.missing }}|{{ d['missing'] }}|{{ d.a }}|{{ d['a'] }}|{{ l[5] }}|{{ none_var }}|",
     "{\"d\": {\"a\": 1}, \"l\": [1]}", "||1|1|||"},
    {"{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.items()|list }} {{ d.keys()|list }} {{ "
     "d.values()|list }}",
     "{\"d\": {\"a\": 1, \"b\": [2]}}", "1 None 5 [('a', 1), ('b', [2])] ['a', 'b'] [1, [2]]"},
};

const RenderCase kPythonPrinting[] = {
    {"{{ none }} {{ true }} {{ false }} {{ 1 }} {{ -3 }} {{ 1.0 }} {{ 1.5 }} {{ 4 / 2 }} {{ 3 / 2 }}", "{}",
     "None True False 1 -3 1.0 1.5 2.0 1.5"},
    {"{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e-7 }} {{ 123456789.123 }} {{ -0.0 }} {{ 0.1 + 0.2 }} {{ "
     "1e300 * 1e10 }} {{ 1/3 }} {{ 1e22 }} {{ 5e-324 }}",
     "{}",
     "1e+16 1000000000000000.0 0.0001 1e-05 1.5e-07 123456789.123 -0.0 0.30000000000000004 inf 0.3333333333333333 "
     "1e+22 5e-324"},
    {"{{ (1,) }} {{ () }} {{ (1, 'a') }} {{ 1, 2 }} {{ [] }} {{ {} }} {{ {'a': none, 1: true} }} {{ [1, [2, (3, {'a': "
     "[none, true]})]] }}",
     "{}", "(1,) () (1, 'a') (1, 2) [] {} {'a': None, 1: True} [1, [2, (3, {'a': [None, True]})]]"},
    {"{{ ['a\\'b', \"q\\\"\", '\\n', 'é', '\\x00', '\\u200b', '\\\\', \"'\", '\"'] }}", "{}",
     "[\"a'b\", 'q\"', '\\n', 'é', '\\x00', '\\u200b', '\\\\', \"'\", '\"']"},
    {"{{ '\\x7f\\x80\\xa0\\xad\\u0300\\u2028\\U0001F600\\t\\r'|list }}", "{}",
     "['\\x7f', '\\x80', '\\xa0', '\\xad', '̀', '\\u2028', '😀', '\\t', '\\r']"},
    {"{{ x }}|{{ x|string }}|{{ [x]|string }}|{{ range(3)|list }}|{{ {'k': 'v'}|string }}", "{}",
     "||[Undefined]|[0, 1, 2]|{'k': 'v'}"},
    {"{% set ns = namespace(a=1) %}{{ ns }} {% for i in [1, 2] %}{{ loop }}{% endfor %} {% macro m() %}{% endmacro "
     "%}{{ m }}",
     "{}", "<Namespace {'a': 1}> <LoopContext 1/2><LoopContext 2/2> <Macro 'm'>"},
};

const RenderCase kFilters[] = {
    {"{{ 'hello world'|title }} {{ 'HELLO'|lower }} {{ 'x'|upper }} {{ 'hELLO'|capitalize }} {{ ' x '|trim }} {{ "
     "'xxyxx'|trim('x') }} {{ 'a'|center(5) }}|",
     "{}", "Hello World hello X Hello x y   a  |"},
    {"{{ 'The Quick-brown fox (jumped) [over] <the> {lazy} dog'|title }} {{ \"it's o'neil\"|title }} {{ 'ß "
     "straße'|upper }} {{ 'ΟΔΟΣ'|lower }}",
     "{}", "The Quick-Brown Fox (Jumped) [Over] <The> {Lazy} Dog It's O'neil SS STRASSE οδος"},
    {"{{ [3,1,2]|sort }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} {{ "
     "[3,1,2]|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|join(',') }}",
     "{\"users\": [{\"name\": \"a\", \"age\": 30}, {\"name\": \"b\", \"age\": 20}]}",
     "[1, 2, 3] ['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1] b,a"},
    {"{{ users|sort(attribute='age,n')|map(attribute='n')|join }} {{ users|sort(attribute='n', "
     "reverse=true)|map(attribute='n')|join }}",
     "{\"users\": [{\"n\": \"b\", \"age\": 1}, {\"n\": \"a\", \"age\": 1}, {\"n\": \"c\", \"age\": 0}]}", "cab cba"},
    {"{{ [1,2,3]|join('-') }} {{ [1,2]|join }} {{ users|join(', ', attribute='name') }} {{ [1, none, true]|join }}",
     "{\"users\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}", "1-2-3 12 a, b 1NoneTrue"},
    {"{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ []|first }}|{{ 'abc'|first }} {{ {'a':1}|first }} {{ [1,2,3]|length }} "
     "{{ 'héllo'|count }} {{ {'a':1}|length }} {{ x|length }}",
     "{}", "1 3 |a a 3 5 1 0"},
    {"{{ [1,2,2,3,1]|unique|list }} {{ ['a','A','b']|unique|list }} {{ [3,1,2]|max }} {{ [3,1,2]|min }} {{ "
     "['a','B']|max }} {{ []|max }}|{{ [1,2,3]|sum }} {{ [[1],[2]]|sum(start=[]) }} {{ "
     "[{'v':1},{'v':2}]|sum(attribute='v') }}",
     "{}", "[1, 2, 3] ['a', 'b'] 3 1 B |6 [1, 2] 3"},
    {"{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('even')|list }} {{ [0,1,'',2]|select|list }} {{ [1, 2, "
     "3]|select('gt', 1)|list }} {{ [none, 1]|reject('none')|list }}",
     "{}", "[1, 3] [1, 3] [1, 2] [2, 3] [1]"},
    {"{{ users|selectattr('active')|map(attribute='name')|list }} {{ "
     "users|rejectattr('active')|map(attribute='name')|list }} {{ users|selectattr('name','equalto','b')|list }}",
     "{\"users\": [{\"name\": \"a\", \"active\": true}, {\"name\": \"b\", \"active\": false}]}",
     "['a'] ['b'] [{'name': 'b', 'active': False}]"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|unique|list "
     "}}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
     "{\"role\": \"user\", \"content\": \"c\"}]}",
     "2 ['user', 'assistant']"},
    {"{{ ['a','b']|map('upper')|list }} {{ users|map(attribute='missing', default='z')|list }} {{ "
     "[1,2]|map('string')|join('+') }} {{ users|map(attribute='tags.0')|list }}",
     "{\"users\": [{\"name\": \"a\", \"tags\": [\"t\"]}]}", "['A', 'B'] ['z'] 1+2 ['t']"},
    {"{{ {'b':1,'a':2}|dictsort }} {{ {'b':1,'a':2}|dictsort(by='value') }} {{ {'b':1,'a':2}|dictsort(reverse=true) }} "
     "{{ {'a':1}|items|list }} {{ none_var|items|list }}",
     "{}", "[('a', 2), ('b', 1)] [('b', 1), ('a', 2)] [('b', 1), ('a', 2)] [('a', 1)] []"},
    {"{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ x|d('e') }}",
     "{}", "d  d None e"},
    {"{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1f'|int(0, 16) }} {{ "
     "'3.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ true|int }}",
     "{}", "42 42 0 7 3 31 3.5 0.0 3.0 1"},
    {"{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1,'floor') }} {{ 42.51|round(1,'ceil') }} {{ "
     "5|round }} {{ -2.5|round }} {{ 1234|round(-2) }}",
     "{}", "2.0 4.0 2.67 42.5 42.6 5 -2.0 1200"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ "
     "'x'|indent('> ', first=true) }}",
     "{}", "a\n    b\n\n    c|  a\n  b|a\n  \n  b|> x"},
    {"{{ [1,2,3]|reverse|list }} {{ 'abc'|reverse }} {{ 'a b  c'|wordcount }} {{ '<a href=\"x\">&\\''|e }} {{ 1|string "
     "~ 'x' }} {{ 'a.b'|replace('.', '-') }} {{ 'aaa'|replace('a', 'b', 2) }}",
     "{}", "[3, 2, 1] cba 3 &lt;a href=&#34;x&#34;&gt;&amp;&#39; 1x a-b bba"},
    {"{{ '%s=%d'|format('a', 1) }} {{ '%(x)s'|format(x=2) }} {{ 'a'|safe }} {{ {'a':1}|attr('a') }}|{{ "
     "'abc'|attr('upper')() }} {{ -3|abs }} {{ 'ab'|list }}",
     "{}", "a=1 2 a |ABC 3 ['a', 'b']"},
};

const RenderCase kTojson[] = {
    {"{{ x|tojson }}",
     "{\"x\": {\"a\": [1, 2.5, null, true, \"é\\\"\\n\\t\\u0001</>\", {\"b\": {}}], \"c\": [], \"d\": 1e-07, \"e\": "
     "1000000000000000}}",
     "{\"a\": [1, 2.5, null, true, \"é\\\"\\n\\t\\u0001</>\", {\"b\": {}}], \"c\": [], \"d\": 1e-07, \"e\": "
     "1000000000000000}"},
    {"{{ x|tojson(indent=2) }}", "{\"x\": {\"a\": [1, {\"b\": []}], \"c\": {}, \"z\": \"q\"}}",
     "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ],\n  \"c\": {},\n  \"z\": \"q\"\n}"},
    {"{{ x|tojson(indent=2, sort_keys=true) }}|{{ x|tojson(separators=(',', ':')) }}|{{ x|tojson(ensure_ascii=true) }}",
     "{\"x\": {\"b\": \"é😀\", \"a\": [1, 2]}}",
     "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": \"é😀\"\n}|{\"b\":\"é😀\",\"a\":[1,2]}|{\"b\": "
     "\"\\u00e9\\ud83d\\ude00\", \"a\": [1, 2]}"},
    {"{{ {'a': [1, 2]}|tojson(indent='\\t') }}|{{ {'a': 1}|tojson(indent=0) }}|{{ 1.0|tojson }}|{{ {1: 'a', true: 'b', "
     "none: 1}|tojson }}|{{ (1, 2)|tojson }}",
     "{}", "{\n\t\"a\": [\n\t\t1,\n\t\t2\n\t]\n}|{\n\"a\": 1\n}|1.0|{\"1\": \"b\", \"null\": 1}|[1, 2]"},
};

const RenderCase kTests[] = {
    {"{{ 1 is odd }} {{ 2 is even }} {{ 6 is divisibleby 3 }} {{ 6 is divisibleby(4) }} {{ x is defined }} {{ x is "
     "undefined }} {{ none is none }} {{ 1 is none }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is "
     "false }} {{ true is boolean }}",
     "{}", "True True True False False True True False True False True False True"},
    {"{{ 1 is integer }} {{ 1.0 is float }} {{ true is integer }} {{ 'a' is string }} {{ {} is mapping }} {{ 1 is "
     "number }} {{ true is number }} {{ [] is sequence }} {{ 'a' is sequence }} {{ 1 is sequence }} {{ {} is iterable "
     "}} {{ 1 is iterable }} {{ x is iterable }}",
     "{}", "True True False True True True True True True False True False True"},
    {"{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }} {{ 2 is in [1,2] }} {{ 1 is eq 1 }} {{ 1 is ne 2 "
     "}} {{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 1 is lt 2 }} {{ 2 is le 1 }} {{ 1 is equalto 1 }} {{ 'upper' is filter }} "
     "{{ 'odd' is test }} {{ none is sameas none }}",
     "{}", "True True False True True True True True True False True True True True"},
    {"{{ x is not defined }} {{ y is not none }} {{ (1 is odd) and (2 is even) }} {{ not x is defined }} {{ range is "
     "callable }} {{ 'a' is callable }}",
     "{\"y\": null}", "True False True True True False"},
    {"{{ tools is not none }} {{ tools is iterable }} {{ tools[0] is mapping }} {{ tools[0].function is defined }} {{ "
     "tools[0].type is string }}",
     "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", "True True True True True"},
};

const RenderCase kWhitespaceControl[] = {
    {"a\n  {% if true %}\n    x\n  {% endif %}\nb\n", "{}", "a\n    x\nb"},
    {"a\n  {%- if true -%}\n    x\n  {%+ endif %}\nb", "{}", "ax\n  b"},
    {"  {{ 1 }}  \n  {# c #}\n  {#- c -#}  x\n{% raw %}  {{ a }} {% endraw %}\n y", "{}", "  1  \nx\n  {{ a }}  y"},
    {"{% raw -%}  {{ a }}  {%- endraw %}z", "{}", "{{ a }}z"},
    {"\t{% for i in [1,2] %}\n\t{{ i }}\n\t{% endfor %}\n", "{}", "\t1\n\t2\n"},
    {"x {%+ if 1 %}y{% endif +%}\nz", "{}", "x y\nz"},
    {"line1\r\nline2\r{{ 'a' }}\n\n", "{}", "line1\nline2\na\n"},
    {"{%- for m in ['a','b'] %}\n    {{- m }}\n{%- endfor %}\n", "{}", "ab"},
    {"{{- '  x  ' -}}|a  {{- 'b' }}  c|text {% if true %}   {% endif %}   more", "{}", "  x  |ab  c|text       more"},
    {"{% if true %}\n{% endif %}\nafter\n   {% set x = 1 %}   \nA{{ x }}", "{}", "after\n   \nA1"},
    {"{%- if true %}\n    {{- 'a' }}\n{%- endif %}\n{{- 'b' -}}\n\n  c  \n", "{}", "abc  "},
};

const RenderCase kLoops[] = {
    {"{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}|{% for i in range(5) %}{% if i "
     "is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
     "{}", "012|024"},
    {"{% for i in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ "
     "loop.last }}{{ loop.length }}{{ loop.depth }}{{ loop.depth0 }};{% endfor %}",
     "{}", "1032TrueFalse310;2121FalseFalse310;3210FalseTrue310;"},
    {"{% for i in [1,2,3] %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('a','b') }}|{{ loop.changed(i > 1) "
     "}}]{% endfor %}",
     "{}", "[|2|a|True][1|3|b|True][2||a|False]"},
    {"{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }},{% endfor %}{{ loop.index }};{% endfor %}",
     "{}", "113,214,1;123,224,2;"},
    {"{% for k in {'x':1,'y':2} %}{{ k }}{% endfor %}|{% for ch in 'héé' %}{{ ch }}.{% endfor %}|{% for x in none_var "
     "%}{% else %}empty{% endfor %}",
     "{}", "xy|h.é.é.|empty"},
    {"{% for a, b in [[1,2],[3,4]] %}{{ a+b }}{% endfor %}{% for k, v in {'x': [1]}|items %}{{ k }}{{ v }}{% endfor "
     "%}{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}",
     "{}", "37x[1]b=1;a=2;"},
    {"{% for x in [1,2,3,4] if x is even %}{{ x }}/{{ loop.index }}/{{ loop.length }} {% endfor %}", "{}",
     "2/1/2 4/2/2 "},
    {"{% for x in [] %}a{% else %}b{% endfor %}{% for x in [1] if false %}a{% else %}c{% endfor %}", "{}", "bc"},
    {"{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}{% for i in "
     "range(0) %}x{% endfor %}",
     "{}", "147531"},
    {"{% for message in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}{{ message }}{% endfor %}",
     "{\"messages\": [\"a\", \"b\", \"c\"]}", "2c1b0a"},
};

const RenderCase kScoping[] = {
    {"{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %}{{ x }}", "{}", "innerouter"},
    {"{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "{}", "12121"},
    {"{% for i in range(3) %}{% if i == 0 %}{% set x = 'a' %}{% endif %}[{{ x }}]{% endfor %}[{{ x }}]", "{}",
     "[a][][][]"},
    {"{% set i = 9 %}{% for i in [1,2] %}{{ i }}{% endfor %}{{ i }}", "{}", "129"},
    {"{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", "{}", "2"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c }}", "{}", "12(3, 4)"},
    {"{% set ns = namespace(x=0, y='a') %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}{{ "
     "ns.y }}{{ ns.z }}|{{ ns }}",
     "{}", "3a|<Namespace {'x': 3, 'y': 'a'}>"},
    {"{% set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }}{% set ns2 = namespace({'k': 'v'}) %}{{ ns2.k }}", "{}",
     "1v"},
    {"{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y }}", "{}", "[block 2]UP"},
    {"{% with a = 1, b = 2 %}{{ a + b }}{% set c = 3 %}{% endwith %}[{{ a }}{{ c }}]", "{}", "3[]"},
    {"{% filter upper %}hello {{ 'x' }}{% endfilter %}{% filter trim|upper %}  ab  {% endfilter %}", "{}", "HELLO XAB"},
    {"{% set messages = messages[1:] %}{{ messages|length }}{% set d = dict(a=1, b='x') %}{{ d }}",
     "{\"messages\": [1, 2, 3]}", "2{'a': 1, 'b': 'x'}"},
    {"{% generation %}gen {{ 1 }}{% set g = 1 %}{% endgeneration %}[{{ g }}]", "{}", "gen 1[]"},
};

const RenderCase kMacros[] = {
    {"{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('A') }} {{ greet('B', "
     "'Hi') }} {{ greet(name='C') }} {{ greet() }}|",
     "{}", "Hello, A! Hi, B! Hello, C! Hello, !|"},
    {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", "{}", "1(2, 3){'x': 4}"},
    {"{% macro m(a, b=a~'!') %}{{ b }}{% endmacro %}{{ m('x') }}", "{}", "x!"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "{}", "120"},
    {"{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside {{ 1 }}{% endcall %}", "{}",
     "[inside 1]"},
    {"{% macro list(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) list([1,2]) %}<{{ "
     "x }}>{% endcall %}",
     "{}", "<1><2>"},
    {"{% macro m() %}x{% endmacro %}{{ m() ~ m() }}{{ m() + 'y' }}|{{ m is callable }}", "{}", "xxxy|True"},
    {"{% set g = 'global' %}{% macro m() %}{{ g }}{% set g = 'local' %}{{ g }}{% endmacro %}{{ m() }}{{ g }}", "{}",
     "globallocalglobal"},
    {"{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", "{}", "2"},
    {"{%- macro json_to_python_type(json_spec) %}\n{%- if json_spec.type == 'array' %}\n    {{- 'list[' + "
     "json_to_python_type(json_spec|items) + ']' }}\n{%- elif json_spec.type is iterable %}\n    {{- 'Union[' }}\n    "
     "{%- for t in json_spec.type %}{{ t }}{% endfor %}\n    {{- ']' }}\n{%- else %}\n    {{- 'str' }}\n{%- endif "
     "%}\n{%- endmacro %}\n{{- json_to_python_type({'type': 'array', 'items': {'type': 'string'}}) }}",
     "{}", "list[Union[]]"},
};

const RenderCase kSlicing[] = {
    {"{{ l[0] }}|{{ l[-1] }}|{{ l[1:] }}|{{ l[::-1] }}|{{ l[:-1] }}|{{ l[::2] }}|{{ l[5:] }}|{{ l[4:1:-1] }}|{{ "
     "l[-100:100] }}|{{ (1,2,3)[1:] }}",
     "{\"l\": [1, 2, 3, 4, 5]}",
     "1|5|[2, 3, 4, 5]|[5, 4, 3, 2, 1]|[1, 2, 3, 4]|[1, 3, 5]|[]|[5, 4, 3]|[1, 2, 3, 4, 5]|(2, 3)"},
    {"{{ s[0] }}|{{ s[-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}|{{ 'Hello'[1:-1] }}|{{ 'Hello'[-3:] }}|{{ "
     "'Hello'[10:] }}|{{ 'abc'[5] }}|",
     "{\"s\": \"héllo wörld\"}", "h|d|él|dlröw olléh|11|ell|llo|||"},
};

const RenderCase kStringMethods[] = {
    {"{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ "
     "'\\u3000x\\u3000'.strip() }}|{{ 'a\\n\\n'.rstrip('\\n') }}",
     "{}", "a b|a|a|a|x|a"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '  "
     "a  b  c '.split(None, 1) }} {{ '  a  b  c '.rsplit(None, 1) }} {{ ''.split(',') }} {{ "
     "'a</think>b'.split('</think>', 1) }}",
     "{}", "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c'] ['a', 'b  c '] ['  a  b', 'c'] [''] ['a', 'b']"},
    {"{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ "
     "'HeLLo'.swapcase() }} {{ 'héllo wörld'.upper() }} {{ 'ﬁx'.title() }}",
     "{}", "HELLO hello Hello World Hello hEllO HÉLLO WÖRLD Fix"},
    {"{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x','c')) }} {{ 'abc'.find('c') }} {{ 'abc'.find('z') }} {{ "
     "'abcabc'.rfind('b') }} {{ 'abcabc'.count('b') }} {{ 'aaa'.replace('a','b',2) }} {{ 'abc'.startswith('b', 1) }} "
     "{{ 'aaaa'.count('aa') }}",
     "{}", "True True 2 -1 4 2 bba True 2"},
    {"{{ '-'.join(['a','b']) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'ab'.center(6, '*') }} "
     "{{ 'ab'.ljust(4) }}| {{ 'ab'.rjust(4,'0') }} {{ '42'.zfill(5) }} {{ '-42'.zfill(5) }}",
     "{}", "a-b ('a', '=', 'b=c') ('a=b', '=', 'c') **ab** ab  | 00ab 00042 -0042"},
    {"{{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ 'abc'.islower() }} {{ "
     "'ABC'.isupper() }} {{ ''.isalpha() }} {{ 'ñ'.isalpha() }}",
     "{}", "True True True True True True False True"},
    {"{{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'pre_x'.removeprefix('pre_') }} {{ 'x.py'.removesuffix('.py') }}", "{}",
     "['a', 'b', 'c'] x x"},
    {"{% set content = '<think>\\nr\\n</think>\\n\\nanswer' %}{{ content.split('</think>')[-1].lstrip('\\n') }}|{{ "
     "content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
     "{}", "answer|r"},
};

const RenderCase kFormatting[] = {
    {"{{ '{} and {}'.format(1, 'b') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='x') }} {{ "
     "'{:>5}|{:<5}|{:^5}'.format('a','b','c') }} {{ '{:05d} {:.2f} {:,}'.format(42, 3.14159, 1234567) }} {{ "
     "'{{}}'.format() }}",
     "{}", "1 and b aba x!     a|b    |  c   00042 3.14 1,234,567 {}"},
    {"{{ '{:x} {:o} {:b} {:#x} {:+d} {:e} {:.3e} {:g} {:%} {:10.3f}| {:*^9}'.format(255, 8, 5, 255, 3, 1234.5, 1234.5, "
     "0.00001234, 0.5, 3.14159, 'mid') }}",
     "{}", "ff 10 101 0xff +3 1.234500e+03 1.234e+03 1.234e-05 50.000000%      3.142| ***mid***"},
    {"{{ '{!r} {!s} {}'.format('a', 'b', none) }} {{ '{}'.format(1.0) }} {{ '{0[a]} {0.b}'.format({'a': 1, 'b': 2}) }}",
     "{}", "'a' b None 1.0 1 2"},
    {"{{ '%s-%d-%05.2f-%x-%r' % ('a', 3, 2.5, 255, 'q') }} {{ '%s' % 'x' }} {{ '%(a)s' % {'a': 1} }} {{ '%5s|%-5s|' % "
     "('a', 'b') }} {{ '%%' % () }}",
     "{}", "a-3-02.50-ff-'q' x 1     a|b    | %"},
    {"{{ '%5.1f|%-6d|%06.2f|%+d|%X|%o|%e|%g|%c|%i|%.3s' % (3.14159, 42, 2.5, 5, 255, 8, 12345.678, 0.0001, 'z', 7, "
     "'abcdef') }} {{ '%s' % none }} {{ '%s' % [1, 2] }} {{ '%d' % 3.9 }}",
     "{}", "  3.1|42    |002.50|+5|FF|10|1.234568e+04|0.0001|z|7|abc None [1, 2] 3"},
    {"{{ strftime_now('%Y-%m-%d %H:%M:%S|%d %b %Y|%A|%j') }}", "{}", "2024-07-26 13:05:09|26 Jul 2024|Friday|208"},
};

const ErrorCase kErrorCases[] = {
    {"{{ 1 + 'a' }}", "{}", "template:1: TypeError: unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ 'a' + 1 }}", "{}", "template:1: TypeError: can only concatenate str (not \"int\") to str"},
    {"line1\n{{ x.y }}", "{}", "template:2: UndefinedError: 'x' is undefined"},
    {"{{ x + 1 }}", "{}", "template:1: UndefinedError: 'x' is undefined"},
    {"{{ x() }}", "{}", "template:1: UndefinedError: 'x' is undefined"},
    {"{{ x|tojson }}", "{}", "template:1: TypeError: Object of type Undefined is not JSON serializable"},
    {"{{ d.a.b }}", "{\"d\": {}}", "template:1: UndefinedError: 'dict object' has no attribute 'a'"},
    {"{{ l[5].x }}", "{\"l\": []}", "template:1: UndefinedError: list object has no element 5"},
    {"{{ 'a' in 1 }}", "{}", "template:1: TypeError: argument of type 'int' is not iterable"},
    {"{{ 1 in 'a' }}", "{}", "template:1: TypeError: 'in <string>' requires string as left operand, not int"},
    {"{{ [1,2] < 3 }}", "{}", "template:1: TypeError: '<' not supported between instances of 'list' and 'int'"},
    {"{% for x in 5 %}{% endfor %}", "{}", "template:1: TypeError: 'int' object is not iterable"},
    {"{% for a, b in [[1,2,3]] %}{% endfor %}", "{}", "template:1: ValueError: too many values to unpack (expected 2)"},
    {"{{ 1 / 0 }}", "{}", "template:1: ZeroDivisionError: division by zero"},
    {"{{ l.append(2) }}", "{\"l\": [1]}",
     "template:1: SecurityError: access to attribute 'append' of 'list' object is unsafe."},
    {"{% set notns = {} %}{% set notns.a = 1 %}", "{}",
     "template:1: TemplateRuntimeError: cannot assign attribute on non-namespace object"},
    {"{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{}",
     "template:1: TypeError: macro 'm' takes not more than 1 argument(s)"},
    {"{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}", "{}",
     "template:1: TypeError: macro 'm' takes no keyword argument 'b'"},
    {"{% if true %}{{ x|nosuchfilter }}{% endif %}", "{}",
     "template:1: TemplateRuntimeError: No filter named 'nosuchfilter' found."},
    {"{{ range(200000)|length }}", "{}",
     "template:1: OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"{{ '%d' % 'x' }}", "{}", "template:1: TypeError: %d format: a real number is required, not str"},
    {"{{ 'x'.index('y') }}", "{}", "template:1: ValueError: substring not found"},
    // Widths and precisions past 2^31 are Python's ValueError, never an integer overflow (found by
    // fuzz_chat_template: a %-format width of 40 digits).
    {"{{ '%99999999999999999999999999999999999999d' % 1 }}", "{}", "template:1: ValueError: width too big"},
    {"{{ '%.99999999999999999999f' % 1.5 }}", "{}", "template:1: ValueError: precision too big"},
    {"{{ '%2147483648d' % 1 }}", "{}", "template:1: ValueError: width too big"},
    {"{{ '{:99999999999999999999}'.format(1) }}", "{}",
     "template:1: ValueError: Too many decimal digits in format string"},
    {"{{ '{:.99999999999999999999}'.format(1.5) }}", "{}",
     "template:1: ValueError: Too many decimal digits in format string"},
    {"a\nb\n{% if x %}\n{{ 1 +* 2 }}\n{% endif %}", "{}", "template:4: TemplateSyntaxError: unexpected '*'"},
    {"{% if true %}", "{}",
     "template:1: TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following tags: 'elif' or "
     "'else' or 'endif'. The innermost block that needs to be closed is 'if'."},
    {"{% for x in y %}{% endif %}", "{}",
     "template:1: TemplateSyntaxError: Encountered unknown tag 'endif'. Jinja was looking for the following tags: "
     "'endfor' or 'else'. The innermost block that needs to be closed is 'for'."},
    {"{% foo %}", "{}", "template:1: TemplateSyntaxError: Encountered unknown tag 'foo'."},
    {"{{ x|nosuchfilter }}", "{}", "template:1: TemplateAssertionError: No filter named 'nosuchfilter'."},
    {"{{ x is nosuchtest }}", "{}", "template:1: TemplateAssertionError: No test named 'nosuchtest'."},
    {"{% set 1 = 2 %}", "{}", "template:1: TemplateSyntaxError: can't assign to 'const'"},
    {"{% macro m(a=1, b) %}{% endmacro %}", "{}",
     "template:1: TemplateSyntaxError: non-default argument follows default argument"},
    {"{{ 'unterminated }}", "{}", "template:1: TemplateSyntaxError: unexpected char \"'\" at 3"},
    {"{# unterminated", "{}", "template:1: TemplateSyntaxError: Missing end of comment tag"},
};

const RenderCase kLexerCorners[] = {
    {"a {{ 'b' }}{#", "{}", "a b"},
    {"a {% raw %}", "{}", "a "},
    {"{{ '\\é\\😀' }}|{% set é = 1 %}{{ é }}|{{ d\u2028['a'] }}", "{\"d\": {\"a\": 1}}", "\\xe9\\U0001f600|1|1"},
    {"{{ 'x' % raw_undefined }}|{{ 'x' % [1] }}|{{ '%s' % [1] }}|{{ '%s' % {'a': 1} }}", "{}", "x|x|[1]|{'a': 1}"},
    {"{{ {'a': {'b': {'c': 1}}} }}|{{ {'a': 1}['a'] }}{{ ({'a': 2}).a }}", "{}", "{'a': {'b': {'c': 1}}}|12"},
};

const RenderCase kLoopControl[] = {
    {"{% for i in range(4) %}{% with x = i %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endwith %}{% endfor %}",
     "{}", "01"},
    {"{% for i in range(4) %}{% filter upper %}a{% if i == 1 %}{% continue %}{% endif %}b{% endfilter %}{% endfor %}",
     "{}", "ABABAB"},
    {"{% for i in range(4) %}{% set x %}a{{ i }}{% if i == 2 %}{% break %}{% endif %}{% endset %}{{ x }}{% endfor %}",
     "{}", "a0a1"},
    {"{% for i in range(3) %}{% for j in range(3) %}{% if j > i %}{% break %}{% endif %}{{ i }}{{ j }} {% endfor %}{% "
     "if i == 1 %}{% continue %}{% endif %}|{% endfor %}",
     "{}", "00 |10 11 20 21 22 |"},
};

TEST(Jinja, Expressions) {
  check_all(kExpressions);
}
TEST(Jinja, PythonPrinting) {
  check_all(kPythonPrinting);
}
TEST(Jinja, Filters) {
  check_all(kFilters);
}
TEST(Jinja, Tojson) {
  check_all(kTojson);
}
TEST(Jinja, Tests) {
  check_all(kTests);
}
TEST(Jinja, WhitespaceControl) {
  check_all(kWhitespaceControl);
}
TEST(Jinja, Loops) {
  check_all(kLoops);
}
TEST(Jinja, Scoping) {
  check_all(kScoping);
}
TEST(Jinja, Macros) {
  check_all(kMacros);
}
TEST(Jinja, Slicing) {
  check_all(kSlicing);
}
TEST(Jinja, StringMethods) {
  check_all(kStringMethods);
}
TEST(Jinja, Formatting) {
  check_all(kFormatting);
}
TEST(Jinja, LexerCorners) {
  check_all(kLexerCorners);
}
// A template is raw bytes when it comes from a GGUF file. Invalid UTF-8 in a string literal gives
// one code point per lead byte and its continuation slots (and U+FFFD for a truncated tail), the same
// count whichever operation asks (length, indexing, slicing): five 0xF1 bytes are two code points
// (found by fuzz_chat_template: an index that the length allowed read past the decoded string).
TEST(Jinja, InvalidUtf8InATemplateCountsAlikeEverywhere) {
  const char* source =
      "{% set s = '\xf1\xf1\xf1\xf1\xf1' %}{{ s|length }} {{ s[1]|length }} {{ s[-1]|length }} {{ s[2] is defined }} "
      "{{ s[1:]|length }} {{ s|list|length }}";
  EXPECT_EQ(render(source, "{}"), "2 1 1 False 1 2");
}

TEST(Jinja, LoopControl) {
  check_all(kLoopControl);
}

TEST(Jinja, ErrorsNameTheLineAndMatchJinja2) {
  for (const ErrorCase& c : kErrorCases) {
    SCOPED_TRACE(c.source);
    try {
      std::string out = render(c.source, c.variables);
      ADD_FAILURE() << "rendered " << out;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), c.expected_error);
    }
  }
}

TEST(Jinja, RaiseExceptionMessageIsVerbatim) {
  try {
    render("{% if true %}\n\n{{ raise_exception('Conversation roles must alternate ' ~ 42) }}{% endif %}", "{}");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate 42");
  }
}

TEST(Jinja, UnknownFiltersFailWhenBuiltExceptInsideIf) {
  // jinja2 rejects them while compiling, but defers those under if/elif/else and inline ifs.
  EXPECT_THROW(Template("{{ x|nosuchfilter }}"), Error);
  EXPECT_THROW(Template("{% for x in y %}{{ x is nosuchtest }}{% endfor %}"), Error);
  Template deferred("{% if false %}{{ x|nosuchfilter }}{% endif %}{{ 1 if true else y|nosuchfilter }}ok");
  EXPECT_EQ(deferred.render(nlohmann::ordered_json::object()), "1ok");
}

TEST(Jinja, SyntaxErrorsNameTheTemplate) {
  try {
    Template("{% for m in messages %}\n{{ m }}\n", {.name = "chat_template.jinja"});
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "chat_template.jinja:2: TemplateSyntaxError: Unexpected end of template. Jinja was looking for the "
              "following tags: 'endfor' or 'else'. The innermost block that needs to be closed is 'for'.");
  }
}

TEST(Jinja, EnvironmentOptions) {
  // Expected strings from jinja2's ImmutableSandboxedEnvironment with the same options.
  const char* source = "a\n  {% if true %}\n  b\n  {% endif %}\nc\n";
  auto with = [&](Options o) { return Template(source, o).render(nlohmann::ordered_json::object()); };
  EXPECT_EQ(with({.trim_blocks = false, .lstrip_blocks = false}), "a\n  \n  b\n  \nc");
  EXPECT_EQ(with({.trim_blocks = true, .lstrip_blocks = false}), "a\n    b\n  c");
  EXPECT_EQ(with({.trim_blocks = false, .lstrip_blocks = true}), "a\n\n  b\n\nc");
  EXPECT_EQ(with({.trim_blocks = true, .lstrip_blocks = true, .keep_trailing_newline = true}), "a\n  b\nc\n");
}

TEST(Jinja, VariablesMustBeAnObject) {
  EXPECT_THROW(Template("x").render(nlohmann::ordered_json::array()), Error);
}

TEST(Jinja, RenderIsThreadSafe) {
  Template t("{% for m in messages %}{{ m.role }}:{{ m.content|upper }};{% endfor %}");
  auto vars = nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "yo"}]})");
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) ok[size_t(i)] += t.render(vars) == "user:HI;assistant:YO;";
    });
  }
  for (auto& th : threads) th.join();
  for (int n : ok) EXPECT_EQ(n, 200);
}

}  // namespace
}  // namespace spill::jinja
