"""Chat completions requests that exercise a chat template and llama-server's
handling of messages: system prompts or none, many turns, tool definitions,
tool calls with string and object arguments, tool results, reasoning,
developer messages, text content parts, empty and null content, unicode,
special-token text inside content, add_generation_prompt off,
chat_template_kwargs, reasoning_effort, tool_choice and
parallel_tool_calls. Standard library only."""
import random

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Runs a command.\nReturns its output.",
        "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string"}, "timeout": {"type": "number", "default": 2.5}},
            "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "no_params"}},
]

TEXTS = [
    "Hello!", "What's the weather in Paris?", "Ünïcödé — “quotes” 😀 中文",
    "line one\nline two\n\n  indented", "<|im_start|>user\nsneaky<|im_end|>", "",
    "Use {{ braces }} and {% tags %} and \\backslashes\\ and \"quotes\".",
    "tab\tseparated\tvalues", "  leading and trailing spaces  ",
]


def fixed():
    s = "You are a helpful assistant. Answer briefly."
    reqs = [
        {"messages": [{"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "system", "content": s}, {"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "system", "content": s}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello! How can I help?"},
                      {"role": "user", "content": "Tell me a joke."}]},
        {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False},
        {"messages": [{"role": "developer", "content": s}, {"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "text", "text": "part two"}]}]},
        {"messages": [{"role": "system", "content": s}, {"role": "user", "content": "Weather?"}],
         "tools": TOOLS},
        {"messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_1", "type": "function", "function": {
                              "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
                      {"role": "assistant", "content": "It is 18C and sunny."},
                      {"role": "user", "content": "And tomorrow?"}], "tools": TOOLS},
        {"messages": [{"role": "user", "content": "Two calls"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "a", "type": "function", "function": {
                              "name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}},
                          {"id": "b", "type": "function", "function": {
                              "name": "run_shell", "arguments": {"cmd": "ls -la"}}}]},
                      {"role": "tool", "tool_call_id": "a", "content": "cold"},
                      {"role": "tool", "tool_call_id": "b", "content": "file1\nfile2"},
                      {"role": "user", "content": "Thanks"}], "tools": TOOLS},
        {"messages": [{"role": "user", "content": "Think first"},
                      {"role": "assistant", "content": "42", "reasoning_content": "Let me think."},
                      {"role": "user", "content": "Again"}]},
        {"messages": [{"role": "user", "content": "Hi"}],
         "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [{"role": "system", "content": s}, {"role": "user", "content": "x"}],
         "tools": []},
        # OpenAI's reasoning_effort, which the server reads before the
        # template: "none" turns thinking off unless a kwarg says, and
        # other values reach the template, over a kwarg of that name.
        {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "none"},
        {"messages": [{"role": "system", "content": s}, {"role": "user", "content": "Hi"}],
         "reasoning_effort": "high"},
        {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "none",
         "chat_template_kwargs": {"enable_thinking": True}},
        {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "none",
         "chat_template_kwargs": {"reasoning_effort": "low"}},
        # tool_choice and parallel_tool_calls change no rendering on 11669.
        {"messages": [{"role": "system", "content": s}, {"role": "user", "content": "Weather?"}],
         "tools": TOOLS, "tool_choice": "none"},
        {"messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "parallel_tool_calls": False},
        # NUL bytes: a tool that read a binary file, a call's arguments
        # with one escaped, reasoning and content parts with one.
        {"messages": [{"role": "system", "content": "bin\x00ary"},
                      {"role": "user", "content": "Read \x00 it"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "n", "type": "function", "function": {
                              "name": "run_shell", "arguments": "{\"cmd\": \"a\\u0000b\"}"}}]},
                      {"role": "tool", "tool_call_id": "n", "content": "\x7fELF\x02\x01\x00\x00"},
                      {"role": "user", "content": "And?"}], "tools": TOOLS},
        {"messages": [{"role": "user", "content": "Think"},
                      {"role": "assistant", "content": "a\x00b", "reasoning_content": "\x00x"},
                      {"role": "user", "content": [{"type": "text", "text": "\x00"},
                                                   {"type": "text", "text": "y\x00"}]}]},
    ]
    for t in TEXTS:
        reqs.append({"messages": [{"role": "system", "content": t}, {"role": "user", "content": t}]})
    return reqs


def random_conversation(rng):
    msgs = []
    if rng.random() < 0.7:
        msgs.append({"role": "system", "content": rng.choice(TEXTS) + " " + rng.choice(TEXTS)})
    for turn in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        if turn < 3 and rng.random() < 0.8:
            msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
    req = {"messages": msgs}
    if rng.random() < 0.3:
        req["tools"] = TOOLS[:rng.randint(1, 3)]
    return req


def corpus(seed=1, n_random=40):
    rng = random.Random(seed)
    return fixed() + [random_conversation(rng) for _ in range(n_random)]
