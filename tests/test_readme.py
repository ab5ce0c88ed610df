"""The README's Python examples run as printed, so that they cannot rot unseen: each ```python
block on a tiny random checkpoint, its placeholder path replaced (and the server's port: the
README's `enginespec serve` line is started as printed, on a free port, with the two flags a
tiny checkpoint needs: a chat template, and the reasoning parser the reasoning example is for).
A block that fails shows its README line."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from enginespec.testing.checkpoints import make_checkpoint
from tests.entrypoints.remote_server import CHAT_TEMPLATE, RemoteServer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

README = Path(__file__).resolve().parents[1] / "README.md"
PLACEHOLDER = "/path/to/hf-checkpoint-dir"


def python_blocks() -> list[tuple[int, str]]:
    """(line of the opening fence, code) of every ```python block, in order."""
    text = README.read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)
    ]


def blocks_using(*needles: str) -> list[tuple[int, str]]:
    found = [(line, code) for line, code in python_blocks() if any(n in code for n in needles)]
    assert found, f"the README has no python block using any of {needles}"
    return found


def run_block(line: int, code: str, namespace: dict) -> None:
    try:
        exec(compile(code, f"README.md:{line}", "exec"), namespace)
    except Exception as exc:  # noqa: BLE001 - re-raised with the block's place
        raise AssertionError(f"README.md's python block at line {line} failed: {exc!r}") from exc


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_checkpoint("qwen3", tmp_path_factory.mktemp("readme") / "qwen3"))


def test_the_offline_examples_run(model_dir, capsys):
    """The LLM block, then the beam search block in the same namespace (it uses its `llm`)."""
    namespace: dict = {"__name__": "readme"}
    for line, code in blocks_using("LLM(", "llm.beam_search"):
        run_block(line, code.replace(PLACEHOLDER, model_dir), namespace)
    assert isinstance(namespace["outs"][0].sequences[0].text, str)  # the beam block ran last
    assert capsys.readouterr().out.strip()  # the LLM block printed its text


def test_the_llm_engine_example_runs(model_dir, capsys):
    """The LLMEngine block, in a namespace of its own: its step loop prints both requests."""
    ((line, code),) = blocks_using("LLMEngine.from_engine_args(")
    namespace: dict = {"__name__": "readme"}
    run_block(line, code.replace(PLACEHOLDER, model_dir), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert sorted(row.split(" ", 1)[0] for row in printed) == ["0", "1"]
    assert not namespace["engine"].has_unfinished_requests()


def test_the_async_example_runs_as_a_script(model_dir, tmp_path):
    """The AsyncLLM block is a script (its engine process is spawned and imports it)."""
    ((line, code),) = blocks_using("AsyncLLM(")
    script = tmp_path / "readme_async.py"
    script.write_text(code.replace(PLACEHOLDER, model_dir))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, f"README.md:{line} as a script failed:\n{done.stderr[-3000:]}"
    texts = eval(done.stdout.strip().splitlines()[-1])  # the list of 8 texts it prints
    assert isinstance(texts, list) and len(texts) == 8


def serve_args() -> list[str]:
    """The README's `enginespec serve` line's flags, less the model and port."""
    line = next(
        line.strip()
        for line in README.read_text().splitlines()
        if line.strip().startswith("enginespec serve ")
    )
    args = shlex.split(line)[3:]
    i = args.index("--port")
    return args[:i] + args[i + 2 :]


def test_the_client_examples_run_against_the_readme_server(model_dir):
    """The openai client block, then the reasoning block and the Responses API block (they use
    its `client`), against the server the README's command starts."""
    args = serve_args() + ["--chat-template", CHAT_TEMPLATE, "--reasoning-parser", "qwen3"]
    server = RemoteServer(Path(model_dir), args)
    try:
        namespace: dict = {"__name__": "readme"}
        for line, code in blocks_using("OpenAI(", "client.chat", "client.responses"):
            run_block(line, code.replace("http://127.0.0.1:8000/v1", server.url("/v1")), namespace)
        message = namespace["resp"].choices[0].message  # the reasoning block's reply
        assert message.reasoning or message.content  # a random model never closes its thinking
        assert namespace["reply"].object == "response"  # the Responses API block ran
    finally:
        assert server.terminate() == 0


RUN_BY_THE_TESTS = (
    "LLM(", "llm.beam_search", "LLMEngine.from_engine_args(", "OpenAI(", "client.chat", "client.responses"
)  # fmt: skip


def test_every_python_block_of_the_readme_is_run_by_a_test():
    """Each ```python block uses what one of the tests above selects its blocks by, so a new
    example cannot be added without a test running it."""
    unrun = [line for line, code in python_blocks() if not any(n in code for n in RUN_BY_THE_TESTS)]
    assert python_blocks() and not unrun, f"README.md's python blocks at lines {unrun} run in no test"


GUIDE = README.parent / "docs" / "writing-a-backend.md"


def test_the_backend_guides_skeleton_loads_as_its_entry_point_names_it(tmp_path, monkeypatch):
    """docs/writing-a-backend.md's skeleton, each block written to the file its first line names
    (pyproject.toml, src/my_backend/__init__.py) and pool.py a reference BlockManager subclass:
    the entry point's target loads, under the name the suite's --impl takes, with the version
    the conformance report reads and the block manager the skeleton replaces."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from enginespec.conformance.report import impl_info
    from enginespec.spec import load_impl
    from enginespec.spec.impl import ENTRY_POINT_GROUP

    blocks = re.findall(r"^```(?:toml|python)\n# (\S+)\n(.*?)^```$", GUIDE.read_text(), flags=re.S | re.M)
    assert sorted(path for path, _ in blocks) == ["pyproject.toml", "src/my_backend/__init__.py"]
    for path, code in blocks:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(code)
    (tmp_path / "src/my_backend/pool.py").write_text(
        "from enginespec.impls.reference import BlockManager\n\n\nclass MyBlockManager(BlockManager):\n    pass\n"
    )
    project = tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]
    ((name, target),) = project["entry-points"][ENTRY_POINT_GROUP].items()
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for module in ("my_backend", "my_backend.pool"):  # imported from this tmp_path, then dropped
        monkeypatch.delitem(sys.modules, module, raising=False)
    impl = load_impl(target)
    assert impl.name == name == "my-backend"
    assert type(impl.new_block_manager(4, 2)).__name__ == "MyBlockManager"
    assert impl_info(name, impl, None)["version"] == project["version"]
