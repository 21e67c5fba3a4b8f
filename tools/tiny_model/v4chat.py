"""DeepSeek-V4 chat encoding, just enough to render the synthetic chat/tool-call slice.

The strings below are format facts (special tokens, DSML tags, the Tools preamble) of the
official V4 encoder; the rendering logic is our own and covers the shapes the corpus uses:
system (+tools), user, assistant (chat or thinking mode, optional DSML tool calls), and tool
results merged into the following user turn.
"""
import json

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DSML = "｜DSML｜"
LATEST_REMINDER = "<｜latest_reminder｜>"

# V4's added tokens carried by the tiny tokenizer, with the `special` / `normalized` flags the
# real V4 tokenizer.json gives them.  BOS/EOS/pad take ids 0/1/2; the rest follow the BPE vocab.
HEAD_TOKENS = [(BOS, True, False), (EOS, True, False), (PAD, True, False)]
TAIL_TOKENS = [
    ("<｜fim▁hole｜>", False, True),
    ("<｜fim▁begin｜>", False, True),
    ("<｜fim▁end｜>", False, True),
    (USER, False, True),
    (ASSISTANT, False, True),
    ("<|EOT|>", False, True),
    (THINK_OPEN, False, True),
    (THINK_CLOSE, False, True),
    (DSML, False, True),
    ("<｜begin▁sys｜>", False, True),
    ("<｜end▁sys｜>", False, True),
    (LATEST_REMINDER, False, True),
]

TOOLS_PREAMBLE = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml}tool_calls>" block like the following:

<{dsml}tool_calls>
<{dsml}invoke name="$TOOL_NAME">
<{dsml}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml}parameter>
...
</{dsml}invoke>
<{dsml}invoke name="$TOOL_NAME2">
...
</{dsml}invoke>
</{dsml}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {think_open}), you MUST output your complete reasoning inside {think_open}...{think_close} BEFORE any tool calls or final response.

Otherwise, output directly after {think_close} with tool calls or final response.

### Available Tool Schemas

{schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""


def render_tools(functions):
    """functions: list of OpenAI `function` objects (name/description/parameters)."""
    schemas = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    return TOOLS_PREAMBLE.format(dsml=DSML, think_open=THINK_OPEN, think_close=THINK_CLOSE, schemas=schemas)


def render_tool_calls(calls):
    """calls: list of (name, dict of arguments) -> the DSML block, without the leading blank line."""
    invokes = []
    for name, args in calls:
        params = []
        for k, v in args.items():
            is_str = isinstance(v, str)
            value = v if is_str else json.dumps(v, ensure_ascii=False)
            params.append(f'<{DSML}parameter name="{k}" string="{"true" if is_str else "false"}">{value}</{DSML}parameter>')
        invokes.append(f'<{DSML}invoke name="{name}">\n' + "\n".join(params) + f"\n</{DSML}invoke>")
    return f"<{DSML}tool_calls>\n" + "\n".join(invokes) + f"\n</{DSML}tool_calls>"


def render(messages, thinking=False):
    """Render a whole conversation that ends with an assistant turn.

    messages: dicts with role in system/user/tool/assistant; assistant may carry
    `reasoning` (thinking mode) and `tool_calls` [(name, args)].  Consecutive tool messages
    are merged into one user turn of <tool_result> blocks, as V4 does.
    """
    out = BOS
    i = 0
    last_user = max(k for k, m in enumerate(messages) if m["role"] in ("user", "tool"))
    while i < len(messages):
        m = messages[i]
        if m["role"] == "system":
            out += m["content"]
            if m.get("tools"):
                out += "\n\n" + render_tools(m["tools"])
            i += 1
        elif m["role"] in ("user", "tool"):
            if m["role"] == "user":
                body = m["content"]
                i += 1
            else:
                blocks = []
                while i < len(messages) and messages[i]["role"] == "tool":
                    blocks.append(f"<tool_result>{messages[i]['content']}</tool_result>")
                    i += 1
                body = "\n\n".join(blocks)
            opens = thinking and (i - 1) >= last_user
            out += USER + body + ASSISTANT + (THINK_OPEN if opens else THINK_CLOSE)
        elif m["role"] == "assistant":
            text = ""
            if thinking and i > last_user:
                text += m.get("reasoning", "") + THINK_CLOSE
            text += m.get("content", "")
            if m.get("tool_calls"):
                text += "\n\n" + render_tool_calls(m["tool_calls"])
            out += text + EOS
            i += 1
        else:
            raise ValueError(f"unknown role {m['role']}")
    return out
