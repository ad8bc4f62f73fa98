"""ChatTemplate renders real chat templates byte for byte as transformers' apply_chat_template(tokenize=False)
does, and refuses hostile templates quickly with the runtime's own error.

The reference side is a PreTrainedTokenizerFast built offline (a character vocabulary) carrying each model's
template and special tokens; nothing is downloaded. The templates are the models' own, copied here.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime

import numpy as np
import pytest

from specexport.errors import OptionError, TemplateError
from specexport.runtime import chat
from specexport.runtime.chat import ChatTemplate

# HuggingFaceTB/SmolLM2-135M-Instruct (as shipped: models/smollm2-135m/chat_template.jinja)
SMOLLM2 = """{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""

# meta-llama/Llama-3.2-1B-Instruct: tools (in the system or the first user turn), date_string or strftime_now
LLAMA32 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Qwen/Qwen2.5-0.5B-Instruct: tools as JSON in the system turn, tool calls and tool responses
QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# mistralai/Mistral-7B-Instruct-v0.1: refuses roles that do not alternate
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# what transformers prepares and passes, printed: messages, tools, documents, tokens, tojson's options
PROBE = ("{{ messages|tojson }}|{{ tools|tojson(indent=2) }}|{{ documents|tojson(separators=(',', ':'), "
         "sort_keys=true) }}|{{ bos_token }}{{ eos_token }}{{ pad_token }}{{ unk_token }}|{{ add_generation_prompt }}"
         "{% generation %}[{{ extra }}]{% endgeneration %}{% for m in messages %}{% if loop.index > 1 %}{% break %}"
         "{% endif %}{{ m.role }}{% endfor %}{{ dict(a=1)|items|list }}{% set ns = namespace(n=0) %}"
         "{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ 'x' ~ 1 ~ none }}")

# jinja constructs the guards rewrite or wrap (loops, ~, literal text, filters, calls, operators), printed
CONSTRUCTS = r"""{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ loop.cycle('a', 'b') }}
{%- if loop.last %}!{% endif %}{% else %}empty{% endfor %}
{% for m in [] %}x{% else %}none{% endfor %}
{% for x in [[1, [2]], [3]] recursive %}({% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}){% endfor %}
{{ none }}{{ [1, 'a', none] }}{{ {'k': none} }}{{ 'a%sb' % 1 }}{{ '{}-{:>3}'.format(1, 'x') }}{{ 'ab' * 2 }}{{ 2 ** 10 }}
{{ 'a,b'.split(',')|join('+') }}{{ messages|map(attribute='role')|join(',') }}{{ messages|selectattr('role', 'equalto', 'user')|list|length }}
{{ '  x '|trim|upper|center(9) }}{{ 'x
y'|indent(2, true) }}{{ 3.5|round|int }}{{ range(5)|batch(2, 0)|list }}{{ 'a b c'|wordwrap(2) }}
{{ 'héllo'|tojson(ensure_ascii=true) }}{{ ['a', 'b']|replace('a', 'z') }}{{ 'abc'.replace('b', 'xyz') }}{{ '-'.join(['p', 'q']) }}
{% set x %}block{{ 1 }}{% endset %}{{ x }}{% macro m(a) %}<{{ a }}{{ caller() if caller else '' }}>{% endmacro %}{{ m(1) }}
{%- call m(2) %}c{% endcall %}{% filter upper %}up{{ 'x' }}{% endfilter %}{% raw %}{{ raw }}{% endraw %}
{{ cycler('u', 'v').next() }}{% set j = joiner('; ') %}{% for i in range(3) %}{{ j() }}{{ i }}{% endfor %}"""

MODELS = {  # template, special tokens as in each model's tokenizer_config.json
    "smollm2": (SMOLLM2, dict(bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
                              unk_token="<|endoftext|>")),
    "llama3.2": (LLAMA32, dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
    "qwen2.5": (QWEN25, dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "mistral": (MISTRAL, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")),
    "probe": (PROBE, dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")),
    "constructs": (CONSTRUCTS, {}),
}

SYSTEM = {"role": "system", "content": "You are terse. Answer in one word."}
TURNS = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Paris."},
         {"role": "user", "content": "And of Japan? Quote it: \"東京\" <b>&</b> \u00e9\n  "}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current temperature at a place, in °C.",
    "parameters": {"type": "object", "properties": {"place": {"type": "string", "description": "City name"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["place"]}}}
CALL = {"role": "assistant", "content": None,  # None-valued keys are dropped, as the OpenAI API sends them
        "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                         "arguments": {"place": "Zürich", "unit": "c"}}}]}
RESULT = {"role": "tool", "content": "{\"temperature\": 21}"}

CHATS = {
    "user": [TURNS[0]],
    "system+user": [SYSTEM, TURNS[0]],
    "multi-turn": [SYSTEM, *TURNS],
}
TOOL_CHATS = {
    "tools": [SYSTEM, TURNS[0]],
    "tool-call": [{"role": "user", "content": "Weather in Zürich?"}, CALL, RESULT],
}


class _FrozenClock(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2025, 2, 3, 4, 5, 6)


@pytest.fixture
def frozen_clock(monkeypatch):
    """strftime_now reads the clock in both renderers: the same fixed instant for both."""
    ctu = pytest.importorskip("transformers.utils.chat_template_utils")
    monkeypatch.setattr(ctu, "datetime", _FrozenClock)
    monkeypatch.setattr(chat, "datetime", _FrozenClock)


def reference(template: str, tokens: dict):
    """A transformers tokenizer carrying `template` and `tokens` (offline: a character vocabulary)."""
    pytest.importorskip("transformers")
    from checkpoints import CHARS, char_tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=char_tokenizer(CHARS).backend_tokenizer,
                                   chat_template=template, **tokens)


def assert_same(model: str, messages, **kwargs):
    tok = reference(*MODELS[model])
    want = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    got = ChatTemplate(tok.chat_template, tok.special_tokens_map).render(messages, **kwargs)
    assert got == want


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("chat_name", list(CHATS))
@pytest.mark.parametrize("model", ["smollm2", "llama3.2", "qwen2.5", "probe", "constructs"])
def test_renders_like_transformers(model, chat_name, gen, frozen_clock):
    assert_same(model, CHATS[chat_name], add_generation_prompt=gen)


@pytest.mark.parametrize("extra", [{}, {"tools_in_user_message": False}, {"date_string": "26 Jul 2024"}])
@pytest.mark.parametrize("chat_name", list(TOOL_CHATS))
@pytest.mark.parametrize("model", ["llama3.2", "qwen2.5", "probe"])
def test_tools_render_like_transformers(model, chat_name, extra, frozen_clock):
    assert_same(model, TOOL_CHATS[chat_name], tools=[WEATHER], add_generation_prompt=True, **extra)


def test_llama_dates_come_from_strftime_now_or_date_string(frozen_clock):
    t = ChatTemplate(LLAMA32, MODELS["llama3.2"][1])
    assert "Today Date: 03 Feb 2025\n" in t.render([TURNS[0]])
    assert "Today Date: 26 Jul 2024\n" in t.render([TURNS[0]], date_string="26 Jul 2024")


def test_inputs_are_prepared_like_transformers():
    # documents, numpy scalars, tuples, reasoning aliases, unknown objects as placeholders, extra variables
    messages = [{"role": "user", "content": "hi", "n": np.int64(3), "x": np.float32(0.5), "t": (1, "a")},
                {"role": "assistant", "content": "ok", "reasoning": "because", "obj": object()}]
    docs = [{"title": "B", "text": "two"}, {"text": "one", "title": "A"}]
    assert_same("probe", messages, documents=docs, add_generation_prompt=False, extra={"k": [1, 2]})


def test_mistral_alternation_and_raise_exception():
    import jinja2

    assert_same("mistral", [TURNS[0], TURNS[1], TURNS[2]], add_generation_prompt=False)
    tok = reference(*MODELS["mistral"])
    bad = [TURNS[0], SYSTEM]
    with pytest.raises(jinja2.TemplateError, match="Only user and assistant roles are supported!"):
        tok.apply_chat_template(bad, tokenize=False)
    with pytest.raises(OptionError, match="^Only user and assistant roles are supported!$"):
        ChatTemplate(MISTRAL, tok.special_tokens_map).render(bad)
    with pytest.raises(TemplateError, match="^Conversation roles must alternate"):
        ChatTemplate(MISTRAL, tok.special_tokens_map).render([TURNS[0], TURNS[0]])


def test_a_token_named_like_an_input_does_not_replace_it():
    t = ChatTemplate("{{ messages[0].content }}|{{ tools }}|{{ add_generation_prompt }}|{{ eos_token }}",
                     {"messages": "spoofed", "tools": ["x"], "add_generation_prompt": "x", "eos_token": "</s>"})
    assert t.render([{"role": "user", "content": "real"}]) == "real|None|True|</s>"


def test_bad_inputs_are_option_errors():
    t = ChatTemplate(SMOLLM2, {})
    for messages in ([], "hello", ["hello"], [1]):
        with pytest.raises(OptionError, match="chat message"):
            t.render(messages)
    with pytest.raises(OptionError, match="tools must be a list of dicts"):
        t.render([TURNS[0]], tools=[print])
    with pytest.raises(TemplateError, match="UndefinedError"):  # a message without a role
        t.render([{"content": "hi"}])


def test_threads_render_independently():
    t = ChatTemplate(QWEN25, {})
    want = t.render([SYSTEM, *TURNS])
    out = []
    threads = [threading.Thread(target=lambda: out.append(t.render([SYSTEM, *TURNS]))) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert out == [want] * 4


HOSTILE = {  # each would hang, or allocate gigabytes, without the guards
    "huge power": "{{ 10 ** 10 ** 10 ** 10 ** 10 }}",
    "int power": "{{ 7 ** 10000000 }}",
    "string repetition": "{{ 'a' * 10 ** 10 }}",
    "list repetition": "{{ ([1] * 10 ** 9)|length }}",
    "nested loops": "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops over a string": ("{% set s = 'x' * 100000 %}"
                                   "{% for a in s %}{% for b in s %}{{ '' }}{% endfor %}{% endfor %}"),
    "huge range": "{% for i in range(10 ** 9) %}{% endfor %}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": ("{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                        "{% endfor %}"),
    "shared list dumped": ("{% set ns = namespace(a=['x' * 100]) %}{% for i in range(64) %}"
                           "{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a|tojson }}"),
    "macro buffer": ("{% macro m() %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}{% endmacro %}"
                     "{% set x = m() %}"),
    "literal text in a loop": "{% for i in range(100000) %}" + "z" * 100000 + "{% endfor %}",
    "replace with empty": "{{ ('x' * 100000)|replace('', 'y' * 100000) }}",
    "str.replace": "{{ ('x' * 100000).replace('', 'y' * 100000) }}",
    "join separator": "{{ range(100000)|join('x' * 100000) }}",
    "width": "{{ 'x'.center(10 ** 10) }}",
    "printf width": "{{ '%999999999999s' % 'a' }}",
    "format width": "{{ '{:>999999999999}'.format('a') }}",
    "tojson indent": "{{ messages|tojson(indent=10 ** 9) }}",
    "indent": "{{ ('\n' * 100000)|indent(100000) }}",
    "slice": "{{ range(3)|slice(10 ** 9)|list|length }}",
    "sum of lists": "{{ ([[1]] * 300000)|sum(start=[])|length }}",
    "map center": "{{ range(100000)|map('center', 1000000)|list|length }}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_are_refused_quickly(name):
    t0 = time.monotonic()
    with pytest.raises(TemplateError) as e:
        ChatTemplate(HOSTILE[name]).render([TURNS[0]])
    assert time.monotonic() - t0 < 2.0, f"{name}: refused only after {time.monotonic() - t0:.1f} s"
    assert isinstance(e.value, OptionError) and "chat template" in str(e.value)


def test_limits_are_the_callers():
    big = [{"role": "user", "content": "x" * 5000}]
    with pytest.raises(TemplateError, match="output exceeds 4096 characters"):  # one piece
        ChatTemplate("{{ messages[0].content }}", max_chars=4096).render(big)
    with pytest.raises(TemplateError, match="output exceeds 8192 characters"):  # the pieces together
        ChatTemplate(SMOLLM2, max_chars=8192).render(big * 2)
    assert len(ChatTemplate(SMOLLM2, max_chars=8192).render(big)) > 5000
    with pytest.raises(TemplateError, match="longer than 0.2 s"):  # a work budget too large to trip first
        ChatTemplate(HOSTILE["nested loops"], max_chars=1 << 40, max_seconds=0.2).render(big)


def test_syntax_errors_and_sandbox_escapes_are_template_errors():
    for source in ("{% for %}", "{{ x|nofilter }}", "{% include 'x' %}", "{{ ''.__class__.__mro__ }}",
                   "{% set ns = namespace() %}{% set ns._x = 1 %}", "{{ lipsum() }}", "{{ 1 / 0 }}"):
        with pytest.raises(TemplateError):
            ChatTemplate(source).render([TURNS[0]])
