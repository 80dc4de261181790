"""Builds a test tokenizer and chat template, and what the reference
libraries make of a set of conversations: Hugging Face `tokenizers` for the
ids, Jinja set up as `transformers`' `apply_chat_template` sets it up for
the rendering. Writes tokenizer.json, tokenizer_config.json and
expected.json into the folder given. No downloads."""

import json
import sys
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)

SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
corpus = [
    "You are a helpful assistant. Answer briefly and cite your sources.",
    "The quick brown fox jumps over the lazy dog; café, naïve, 東京, emoji 🙂.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "Summarise the main causes of the 1929 stock market crash in two sentences.",
] * 20
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=600,
    special_tokens=SPECIAL,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator(corpus, trainer)
tok.post_processor = processors.TemplateProcessing(
    single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
)
tok.save(str(out / "tokenizer.json"))

TEMPLATE = """{%- if tools %}
<|im_start|>system
{%- if messages[0]['role'] == 'system' %}
{{ messages[0]['content'] }}
{%- endif %}

Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
<|im_end|>
{%- elif messages[0]['role'] == 'system' %}
<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{%- endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role ' + message.role) }}
{%- endif %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
<|im_start|>{{ message.role }}
{%- if message.content %}
{{ message.content | trim }}
{%- endif %}
{%- if message.tool_calls %}
{%- for call in message.tool_calls %}
<tool_call>{{ call.function | tojson }}</tool_call>
{%- endfor %}
{%- endif %}<|im_end|>
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

config = {
    "bos_token": "<s>",
    "eos_token": {"content": "</s>", "lstrip": False, "rstrip": False},
    "chat_template": TEMPLATE,
    "model_max_length": 4096,
}
(out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' own filter
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
template = env.from_string(TEMPLATE)

tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now, in °C",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                    "required": ["city"]}}},
]
chats = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Summarise the main causes of the 1929 crash."},
        {"role": "assistant", "content": "  Speculation and credit.  "},
        {"role": "user", "content": "And in two sentences? café 東京 🙂"},
    ]},
    {"messages": [
        {"role": "system", "content": "Use tools when they help."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "18 °C, clear", "tool_call_id": "c1"},
    ], "tools": tools},
    {"messages": [{"role": "user", "content": "def add(a, b):\n    return a + b\n\n<|im_end|> is a special token"}],
     "add_generation_prompt": False},
]
expected = {"chats": [], "completions": []}
for chat in chats:
    agp = chat.get("add_generation_prompt", True)
    text = template.render(messages=chat["messages"], tools=chat.get("tools"), add_generation_prompt=agp,
                           bos_token="<s>", eos_token="</s>")
    ids = tok.encode(text, add_special_tokens=False).ids
    # The JSON as a client sends it, keys in order (the test's own JSON
    # values sort keys).
    wire = {k: json.dumps(v, ensure_ascii=False) for k, v in chat.items() if k in ("messages", "tools")}
    expected["chats"].append({**chat, "wire": wire, "text": text, "ids": ids})
for prompt in ["The quick brown fox", "Answer: café, 東京 🙂\n\n<|im_start|>"]:
    expected["completions"].append({"prompt": prompt, "ids": tok.encode(prompt).ids})
(out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1))
print("ok", len(expected["chats"]), "chats")
