"""Tools: the calculator, the sandbox's limits against hostile input, the tool config loader."""

import asyncio
import functools
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from asyncrl.producers.tools import sandbox
from asyncrl.producers.tools.base import Tool, ToolCall, schema_errors
from asyncrl.producers.tools.calculator import CalculatorTool
from asyncrl.producers.tools.registry import ToolConfigError, ToolExecutor, load_tools
from asyncrl.producers.tools.sandbox import SAFE_BUILTINS, run_python

SHIPPED = Path(__file__).parents[3] / "asyncrl" / "configs" / "tools" / "calculator.yaml"


def _call(tool: Tool, **arguments):
    return asyncio.run(tool.call(ToolCall(tool.name, arguments)))


def test_the_calculator_computes_what_the_tiny_model_cannot():
    result = _call(CalculatorTool(), expression="347*86")
    assert result.ok and result.text == "29842"
    assert _call(CalculatorTool(), expression=" (12-4)**2 // 3 ").text == "21"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument 'expression'"),
        ({"expression": 3}, "argument 'expression' must be of type string"),
        ({"expression": "1+1", "mode": "x"}, "unknown argument 'mode'"),
        ({"expression": ""}, "empty expression"),
        ({"expression": "1/0"}, "ZeroDivisionError"),
        ({"expression": "2+"}, "SyntaxError"),
    ],
)
def test_bad_arguments_come_back_as_an_error_message_not_an_exception(arguments, message):
    result = _call(CalculatorTool(), **arguments)
    assert not result.ok
    assert result.text.startswith("error: ") and message in result.text


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('touch /tmp/pwned')",  # import of os
        "().__class__.__base__.__subclasses__()",  # the classic eval escape
        "[0] * 10**10",  # a huge allocation (lists are not arithmetic)
        "open('/etc/passwd').read()",  # file access
        "9**9**9**9",  # parses as arithmetic, runs into the CPU limit
    ],
)
def test_a_hostile_expression_is_contained_and_the_rollout_goes_on(expression):
    t0 = time.monotonic()
    result = _call(CalculatorTool(config={"timeout_s": 4}), expression=expression)
    assert not result.ok and result.text.startswith("error: ")
    assert time.monotonic() - t0 < 4.5
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize("fresh", [False, True], ids=["fork-server", "fresh-interpreter"])
def test_the_sandbox_limits_hold_even_for_code_the_parser_lets_through(fresh):
    run = functools.partial(run_python, fresh_interpreter=fresh)
    # An infinite loop: the kernel's CPU limit ends it.
    t0 = time.monotonic()
    loop = run("while True:\n    pass", mode="exec", cpu_s=1, timeout_s=10)
    assert not loop.ok and "CPU time limit" in loop.error
    assert time.monotonic() - t0 < 5
    # A huge allocation, with the allocator handed over: the address-space limit stops it.
    big = run("bytearray(2**33)", builtins=(*SAFE_BUILTINS, "bytearray"), memory_mb=256)
    assert not big.ok and big.error == "out of memory"
    # File access, with open() handed over: no descriptor can be opened.
    files = run("open('/etc/hostname').read()", builtins=(*SAFE_BUILTINS, "open"))
    assert not files.ok and "Too many open files" in files.error
    # Imports are refused before anything runs.
    imp = run("import os\nresult = os.getcwd()", mode="exec")
    assert not imp.ok and imp.error == "imports are not allowed"
    # A sleep (or any stall) is killed at the wall-time limit.
    stall = run("sum(range(10**12))", cpu_s=30, timeout_s=0.5)
    assert not stall.ok and stall.error.startswith("timed out")
    # And the sandbox still answers.
    assert run("347*86").output == "29842"


def test_the_sandbox_server_serves_threads_at_once_and_comes_back_if_killed():
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda i: run_python(f"{i}*{i}").output, range(64)))
    assert outputs == [str(i * i) for i in range(64)]
    # Calls share nothing: each child is a fresh fork of a server that never ran user code.
    first = run_python("result = [1]\nresult.append(2)", mode="exec")
    again = run_python("result = [1]\nresult.append(2)", mode="exec")
    assert first.output == again.output == "[1, 2]"
    # A killed server fails nobody after it: the next call starts a new one.
    proc = sandbox._server._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    assert run_python("6*7").output == "42"
    assert sandbox._server._proc is not proc


class _Slow(Tool):
    async def execute(self, arguments):
        await asyncio.sleep(5)
        return "late"


def test_a_tool_that_overruns_its_timeout_returns_an_error():
    schema = {"type": "function", "function": {"name": "slow", "parameters": {"type": "object"}}}
    result = _call(_Slow(schema, {"timeout_s": 0.2}))
    assert not result.ok and result.text == "error: timed out after 0.2 s"


def test_schema_errors_checks_the_subset_tool_schemas_use():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "unit": {"type": "string", "enum": ["a", "b"]}},
        "required": ["n"],
    }
    assert schema_errors(schema, {"n": 3, "unit": "a", "extra": 1}) is None
    assert schema_errors(schema, {"n": True}) == "argument 'n' must be of type integer"
    assert (
        schema_errors(schema, {"n": 1, "unit": "c"}) == "argument 'unit' must be one of ['a', 'b']"
    )
    assert schema_errors(schema, []) == "arguments must be an object, not list"


def test_the_shipped_tool_config_loads_in_verls_format():
    tools = load_tools(SHIPPED)
    assert list(tools) == ["calculator"]
    assert isinstance(tools["calculator"], CalculatorTool)
    assert tools["calculator"].timeout_s == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools: []", "expected a non-empty list under 'tools'"),
        ("tools:\n  - config: {}", "tools[0].class_name: missing"),
        ("tools:\n  - class_name: no.such.Tool", "tools[0].class_name: cannot import"),
        ("tools:\n  - class_name: asyncrl.producers.tools.sandbox.SandboxResult", "not a Tool"),
        (
            "tools:\n  - class_name: asyncrl.producers.tools.calculator.CalculatorTool\n"
            "    tool_schema: {type: function}",
            "tools[0].tool_schema",
        ),
        (
            "tools:\n  - class_name: asyncrl.producers.tools.calculator.CalculatorTool\n"
            "    config: {cpu_s: lots}",
            "tools[0].config.cpu_s must be a positive integer, not 'lots'",
        ),
        (
            "tools:\n  - class_name: asyncrl.producers.tools.calculator.CalculatorTool\n"
            "    config: {fresh_interpreter: sometimes}",
            "tools[0].config.fresh_interpreter must be true or false",
        ),
    ],
)
def test_a_bad_tool_config_fails_naming_the_entry_and_key(tmp_path, text, message):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises(ToolConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_tools(path)


def test_the_executor_runs_a_turns_calls_concurrently_and_answers_bad_ones():
    with ToolExecutor(load_tools(SHIPPED)) as executor:
        t0 = time.monotonic()
        results = executor.run(
            [
                ToolCall("calculator", {"expression": "2**10"}),
                ToolCall("search", {"q": "x"}),
                ToolCall("", error="malformed tool call (not JSON)"),
                ToolCall("calculator", {"expression": "9**9**9**9"}),
                ToolCall("calculator", {"expression": "99*99"}),
            ]
        )
        elapsed = time.monotonic() - t0
    assert [r.ok for r in results] == [True, False, False, False, True]
    assert results[0].text == "1024" and results[4].text == "9801"
    assert "no tool named 'search' (tools: calculator)" in results[1].text
    assert results[2].text == "error: malformed tool call (not JSON)"
    assert elapsed < 4  # the CPU-bound call did not hold up the others


def test_a_tool_config_path_under_home_expands(tmp_path, monkeypatch) -> None:
    """multi_turn.tool_config_path=~/tools.yaml: "cannot read ~/tools.yaml", where model.path,
    the data files and the reward file expand ~."""
    import shutil

    from asyncrl.producers.tools.registry import shipped_tools_path

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copy(shipped_tools_path(), tmp_path / "tools.yaml")
    assert set(load_tools("~/tools.yaml")) == {"calculator"}


class _ReturnsADict(Tool):
    """A verl habit: execute returns a structure (verl's ToolResponse tuple), not the text."""

    async def execute(self, arguments):
        return {"result": 1}


def test_a_tool_that_returns_no_str_is_an_error_result_not_a_crash():
    """It raised TypeError in the loop that cuts the response (unhashable type: 'slice'): the
    trainer's held-out evaluation, or the rollout worker, died with a traceback."""
    schema = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    result = _call(_ReturnsADict(schema))
    assert not result.ok
    assert result.text == "error: tool 'lookup' returned dict, not str"


class _Blocking(Tool):
    """time.sleep in an async def: asyncio.wait_for cannot cancel it."""

    async def execute(self, arguments):
        time.sleep(0.3)
        return "late"


def test_a_tool_that_blocks_past_its_timeout_is_an_error_and_says_why(caplog):
    """A user's tool with time.sleep(3) under timeout_s=0.5 was answered 'late', ok, after 3 s,
    and held every other call of the worker: a run sat at 'waiting for the first step' for
    minutes with nothing in any log."""
    schema = {"type": "function", "function": {"name": "blocky", "parameters": {"type": "object"}}}
    tool = _Blocking(schema, {"timeout_s": 0.05})
    with caplog.at_level("WARNING", logger="asyncrl.producers.tools.base"):
        result, again = _call(tool), _call(tool)
    assert not result.ok and result.text == "error: timed out after 0.05 s"
    assert result.seconds >= 0.3 and not again.ok
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # once per tool, not per call
    assert "'blocky'" in warnings[0] and "asyncio.to_thread" in warnings[0]


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("def broken(:\n", "importing 'my_tools' raised SyntaxError: "),
        ("raise RuntimeError('set MY_API_KEY')\n", "raised RuntimeError: set MY_API_KEY"),
        (
            "from asyncrl.producers.tools.base import Tool\n"
            "class MyTool(Tool):\n"
            "    def __init__(self, tool_schema, config):\n"
            "        raise RuntimeError('no search index at /data/index')\n"
            "    async def execute(self, arguments):\n"
            "        return ''\n",
            "tools[0]: MyTool(tool_schema, config) raised RuntimeError: no search index",
        ),
    ],
)
def test_a_tool_module_that_fails_is_a_config_error_naming_the_file(
    tmp_path, monkeypatch, module, message
):
    """A user's tool module with a syntax error, or one raising at import or in its
    constructor, escaped as a traceback from asyncrl run (--dry-run too)."""
    (tmp_path / "my_tools.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_tools", raising=False)
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: my_tools.MyTool\n    tool_schema: {}\n")
    with pytest.raises(ToolConfigError) as err:
        load_tools(path)
    assert str(err.value).startswith(f"{path}: tools[0]")
    assert message in str(err.value)


def test_a_misspelt_key_of_a_tool_entry_is_refused_not_dropped(tmp_path):
    """tool_shema: (a typo) was ignored: the calculator then ran with its built-in schema and
    a user's own schema never applied, with nothing said; confg: dropped the timeouts."""
    path = tmp_path / "tools.yaml"
    shipped = SHIPPED.read_text()
    path.write_text(shipped.replace("    tool_schema:", "    tool_shema:"))
    with pytest.raises(ToolConfigError) as err:
        load_tools(path)
    assert str(err.value) == (
        f"{path}: tools[0].tool_shema: unknown key (did you mean 'tool_schema'? an entry has "
        "class_name, config, tool_schema)"
    )
    path.write_text(shipped.replace("    config:", "    confg:"))
    with pytest.raises(
        ToolConfigError, match=r"tools\[0\]\.confg: unknown key \(did you mean 'config'"
    ):
        load_tools(path)


def test_a_tool_whose_execute_is_not_async_fails_at_load(tmp_path, monkeypatch):
    """def execute(...) (no async) loaded, and every call came back 'error: TypeError: An
    asyncio.Future, a coroutine or an awaitable is required': a run of tool errors."""
    (tmp_path / "sync_tools.py").write_text(
        "from asyncrl.producers.tools.base import Tool\n"
        "class Echo(Tool):\n"
        "    def execute(self, arguments):\n"
        "        return 'hi'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sync_tools", raising=False)
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: sync_tools.Echo\n"
        "    tool_schema: {type: function, function: {name: echo}}\n"
    )
    with pytest.raises(ToolConfigError, match=r"sync_tools\.Echo\.execute must be an async def"):
        load_tools(path)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("", "tools[0].tool_schema: missing: a tool's schema is {type: function"),
        (
            "tool_schema: {function: {name: x}}",
            "tools[0].tool_schema: type must be function, not None",
        ),
        ("tool_schema: {type: function}", "tools[0].tool_schema: function: missing"),
        (
            "tool_schema: {type: function, function: {description: adds}}",
            "tools[0].tool_schema: function.name: missing",
        ),
    ],
)
def test_a_tool_schema_missing_a_field_names_the_field(tmp_path, schema, message):
    """A schema without its function's name said only 'tool_schema must be {type: function,
    function: {name: ..., ...}}', whichever field was missing."""
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - class_name: {__name__}._Slow\n    {schema}\n")
    with pytest.raises(ToolConfigError) as err:
        load_tools(path)
    assert message in str(err.value)
