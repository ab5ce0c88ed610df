"""The model argument as vLLM users write it: a Hugging Face repo id ("Qwen/Qwen3-0.6B") whose
snapshot is already in the local hub cache loads that snapshot, through LLM, EngineArgs and
AsyncLLM, with vLLM's revision / tokenizer / tokenizer_revision; a repo id or revision the cache
lacks is a CheckpointNotFound naming the field, where it looked and how to fetch the model; and
nothing touches the network, HF_HUB_OFFLINE set or not (worker/hub_cache.py).

The cache is a fake one in the real layout (blobs/, snapshots/<commit>/ symlinked into it,
refs/<ref>), written by enginespec.testing.checkpoints.write_hub_cache and found through
HF_HUB_CACHE or HF_HOME, set per test after huggingface_hub was imported (it reads them once, at
its import: the engine must read them when it resolves)."""

from __future__ import annotations

import asyncio
import json
import pickle
import socket

import huggingface_hub.errors
import pytest

from enginespec import AsyncLLM
from enginespec.engine_args import EngineArgs
from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import make_checkpoint, write_hub_cache
from enginespec.worker.loader import CheckpointNotFound

pytestmark = pytest.mark.usefixtures("torch_one_thread")

REPO = "enginespec-test/tiny-qwen3"
ENGINE = dict(impl="fast", device="cpu", dtype="float32", num_blocks=64, block_size=4)
PROMPT = {"prompt_token_ids": [5, 9, 14, 20, 33, 41]}
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub cache holding REPO twice: refs/main at the seed-0 checkpoint, refs/v2 at a seed-1
    one (other weights, so other greedy tokens). Returns (cache, main snapshot, v2 snapshot)."""
    root = tmp_path_factory.mktemp("hub")
    main = make_checkpoint("qwen3", root / "src-main")
    v2 = make_checkpoint("qwen3", root / "src-v2", seed=1)
    cache = root / "hub"
    return cache, write_hub_cache(main, cache, REPO), write_hub_cache(v2, cache, REPO, ref="v2")


@pytest.fixture
def hub_env(hub, monkeypatch):
    """HF_HUB_CACHE at the fake cache, offline mode off (the lookup must stay local by itself)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub[0]))
    return hub


@pytest.fixture
def no_network(monkeypatch):
    """Every internet socket connect and name lookup raises (and is recorded): the resolver and
    the loaders must never reach for the hub."""
    tried = []

    def refuse(what):
        def raiser(*args, **kwargs):
            tried.append((what, args[:2]))
            raise OSError(f"network use in a test that must stay offline: {what}")

        return raiser

    real_connect = socket.socket.connect

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return refuse("connect")(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    return tried


def _greedy(llm) -> list[int]:
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_a_cached_repo_id_loads_its_snapshot_offline(hub_env, no_network):
    """LLM("org/name") as vLLM users write it: the snapshot refs/main names, token for token
    what the snapshot directory itself gives, and no socket opened (HF_HUB_OFFLINE unset)."""
    _, main, _ = hub_env
    expected = _greedy(LLM(str(main), **ENGINE))
    llm = LLM(REPO, **ENGINE)
    assert _greedy(llm) == expected
    assert llm.engine.args.model == REPO  # the id as given, for the served name and metrics
    assert llm.engine.args.model_dir() == str(main)
    assert llm.get_tokenizer() is not None and no_network == []


def test_hf_home_is_honoured_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    """HF_HOME's hub/ folder is the cache when HF_HUB_CACHE is unset, as for huggingface_hub."""
    home = tmp_path / "home"
    snapshot = write_hub_cache(make_checkpoint("qwen3", tmp_path / "src"), home / "hub", REPO)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    assert EngineArgs(model=REPO).model_dir() == str(snapshot)


def test_without_hf_variables_the_cache_is_under_xdg_cache_home_else_home(tmp_path, monkeypatch):
    """huggingface_hub's fallbacks past HF_HOME: $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub (a host that sets only XDG_CACHE_HOME, as on many Linux desktops,
    has its downloads there)."""
    from enginespec.worker.hub_cache import hub_cache_dir

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    xdg, home = tmp_path / "xdg", tmp_path / "home"
    snapshot = write_hub_cache(make_checkpoint("qwen3", tmp_path / "src"), xdg / "huggingface" / "hub", REPO)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.setenv("HOME", str(home))
    assert hub_cache_dir() == xdg / "huggingface" / "hub"
    assert EngineArgs(model=REPO).model_dir() == str(snapshot)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert hub_cache_dir() == home / ".cache" / "huggingface" / "hub"
    with pytest.raises(CheckpointNotFound, match=str(home / ".cache" / "huggingface" / "hub")):
        EngineArgs(model=REPO).model_dir()


@pytest.mark.parametrize(
    "env",
    [
        {"HF_HUB_CACHE": ""},
        {"HF_HOME": ""},
        {"HUGGINGFACE_HUB_CACHE": "", "HF_HOME": "/elsewhere"},
        {"XDG_CACHE_HOME": ""},
        {"XDG_CACHE_HOME": "/xdg", "HF_HOME": "$XDG_CACHE_HOME/hf"},
        {"XDG_CACHE_HOME": "/xdg", "HF_HUB_CACHE": "$XDG_CACHE_HOME/hub"},
        {"XDG_CACHE_HOME": "/xdg", "HUGGINGFACE_HUB_CACHE": "~/$XDG_CACHE_HOME/hub", "HF_HOME": "/elsewhere"},
        {"HF_HUB_CACHE": "/new", "HUGGINGFACE_HUB_CACHE": "/legacy"},
    ],
    ids=[
        "hub-cache-empty",
        "hf-home-empty",
        "legacy-empty",
        "xdg-empty",
        "hf-home-with-a-variable",
        "hub-cache-with-a-variable",
        "legacy-with-home-and-a-variable",
        "hub-cache-over-legacy",
    ],
)
def test_the_cache_folder_is_huggingface_hubs_own_for_every_setting(env, tmp_path, monkeypatch):
    """hub_cache_dir() is where huggingface_hub (what `hf download` runs) puts the cache, asked
    of a fresh interpreter under the same environment: a variable set to "" is set there (an
    empty HF_HUB_CACHE is the current directory), so it is here (it counted as unset, and the
    lookup went to ~/.cache while `hf download` had written under the current directory).
    Ours is asked here, under that environment (it reads the variables at each call); only
    huggingface_hub, whose constants are read at its import, needs the fresh interpreter, which
    so imports neither enginespec nor torch (seconds each, five times)."""
    import os
    import subprocess
    import sys

    from enginespec.worker.hub_cache import hub_cache_dir

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    code = "import os, huggingface_hub.constants as c; print(os.path.abspath(c.HF_HUB_CACHE))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, check=True
    )
    assert str(hub_cache_dir().absolute()) == done.stdout.strip()


def test_a_revision_picks_its_snapshot_by_ref_or_commit(hub_env, no_network):
    """vLLM's revision: a branch or tag (refs/<name>) or a full commit hash."""
    _, main, v2 = hub_env
    assert EngineArgs(model=REPO, revision="v2").model_dir() == str(v2)
    assert EngineArgs(model=REPO, revision=v2.name).model_dir() == str(v2)
    assert EngineArgs(model=REPO, revision="main").model_dir() == str(main)
    expected = _greedy(LLM(str(v2), **ENGINE))
    assert _greedy(LLM(REPO, revision="v2", **ENGINE)) == expected
    assert expected != _greedy(LLM(REPO, **ENGINE))  # the test tells the two apart
    assert no_network == []


def test_a_revision_the_cache_lacks_names_it_and_how_to_fetch_it(hub_env, no_network):
    cache = hub_env[0]
    with pytest.raises(CheckpointNotFound) as info:
        LLM(REPO, revision="v3", **ENGINE)
    message = str(info.value)
    assert f"model {REPO!r}" in message and "revision 'v3'" in message and str(cache) in message
    assert f"hf download {REPO} --revision v3" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, FileNotFoundError)
    assert no_network == []


def test_a_repo_id_not_in_the_cache_names_the_field_the_places_and_the_download(
    hub_env, no_network, tmp_path
):
    """Neither a local directory nor a cached repo: one message naming the field, the local path
    looked at, the cache looked in (and the variable that sets it) and the command to fetch it."""
    cache = hub_env[0]
    with pytest.raises(CheckpointNotFound) as info:
        LLM("Qwen/Qwen3-0.6B", **ENGINE)
    message = str(info.value)
    assert message.startswith("model 'Qwen/Qwen3-0.6B' does not exist")
    assert "no local directory" in message and str(cache) in message and "HF_HUB_CACHE" in message
    assert "hf download Qwen/Qwen3-0.6B" in message and "nothing is downloaded" in message
    assert "\n" not in message and no_network == []
    missing = tmp_path / "nowhere"  # a path that is no repo id: no cache look-up to speak of
    with pytest.raises(
        CheckpointNotFound, match=f"model '{missing}' does not exist: no local directory {missing}"
    ):
        LLM(str(missing), **ENGINE)


def test_an_incomplete_snapshot_is_the_loaders_checkpoint_error(hub_env, tmp_path, monkeypatch):
    """A snapshot without its weights (an interrupted download) or whose blob was deleted (a
    dangling symlink) is the loader's CheckpointError naming what is missing, not a crash; one
    that huggingface_hub's cached tree listing shows incomplete is said to be incomplete, with
    the hub's list of what is missing (it read "does not exist", then the hub's whole text)."""
    src = make_checkpoint("qwen3", tmp_path / "src")
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    partial = write_hub_cache(src, cache, "org/partial")
    (partial / "model.safetensors").unlink()
    with pytest.raises(CheckpointNotFound, match=f"{partial}.*safetensors"):
        LLM("org/partial", **ENGINE)
    judged = write_hub_cache(src, cache, "org/judged")  # the hub's tree listing of the commit
    listing = {p.name: {"size": p.stat().st_size, "blob_id": "0" * 40} for p in judged.iterdir()}
    trees = judged.parent.parent / "trees"
    trees.mkdir()
    (trees / f"{judged.name}.json").write_text(json.dumps({"format_version": 1, "files": listing}))
    (judged / "model.safetensors").unlink()
    judges = hasattr(huggingface_hub.errors, "IncompleteSnapshotError")  # newer huggingface_hub
    verdict = "is incomplete: 1 file(s) are missing (model.safetensors)" if judges else "no *.safetensors"
    with pytest.raises(CheckpointNotFound) as info:
        LLM("org/judged", **ENGINE)
    message = str(info.value)
    assert verdict in message and "does not exist" not in message and "\n" not in message
    dangling = write_hub_cache(src, cache, "org/dangling")
    (dangling / "model.safetensors").resolve().unlink()
    with pytest.raises(
        CheckpointNotFound, match=r"model\.safetensors is a link to \.\./\.\./blobs/\w+, which"
    ):
        LLM("org/dangling", **ENGINE)


def test_a_tokenizer_repo_id_and_tokenizer_revision(hub_env, tmp_path):
    """vLLM's tokenizer= and tokenizer_revision= (None: the model's revision) resolve as the
    model does; an uncached one names the field `tokenizer`."""
    _, main, v2 = hub_env
    local = make_checkpoint("qwen3", tmp_path / "local")
    assert EngineArgs(model=str(local), tokenizer=REPO).tokenizer_dir() == str(main)
    assert EngineArgs(model=str(local), tokenizer=REPO, tokenizer_revision="v2").tokenizer_dir() == str(v2)
    assert EngineArgs(model=REPO, revision="v2", tokenizer=REPO).tokenizer_dir() == str(v2)
    assert EngineArgs(model=REPO, tokenizer_revision="v2").tokenizer_dir() == str(v2)
    assert EngineArgs(model=REPO).tokenizer_dir() is None  # the model's own
    llm = LLM(str(local), tokenizer=REPO, **ENGINE)
    assert llm.get_tokenizer().encode("abc") == LLM(str(main), **ENGINE).get_tokenizer().encode("abc")
    with pytest.raises(CheckpointNotFound, match="^tokenizer 'org/none' does not exist"):
        LLM(str(local), tokenizer="org/none", **ENGINE)


def test_revisions_are_none_or_a_name():
    for name in ("revision", "tokenizer_revision"):
        for bad in ("", " ", 3):
            with pytest.raises(ValueError, match=f"{name} must be None or a branch, tag or commit"):
                EngineArgs(model="m", **{name: bad})


def test_a_local_directory_wins_and_takes_home_and_relative_paths(hub_env, tmp_path, monkeypatch):
    """An existing directory is the checkpoint whatever the cache holds; `~` is the home
    directory, a relative path the current directory's (revision does not apply to it)."""
    local = make_checkpoint("qwen3", tmp_path / REPO)  # a relative path that reads as a repo id
    monkeypatch.chdir(tmp_path)
    assert EngineArgs(model=REPO, revision="v2").model_dir() == str(local)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert EngineArgs(model=f"~/{REPO}").model_dir() == str(local)


def test_resolved_once_so_every_process_loads_the_same_snapshot(hub_env, tmp_path):
    """The path is resolved once per EngineArgs and travels with it (pickled to the engine
    process and to each tensor-parallel rank): a ref moved meanwhile by a download does not
    split the ranks over two snapshots."""
    cache, main, v2 = hub_env
    args = EngineArgs(model=REPO)
    assert args.model_dir() == str(main)
    ref = cache / ("models--" + REPO.replace("/", "--")) / "refs" / "main"
    ref.write_text(v2.name)
    try:
        assert pickle.loads(pickle.dumps(args)).model_dir() == str(main)
        assert EngineArgs(model=REPO).model_dir() == str(v2)  # a new one sees the new ref
    finally:
        ref.write_text(main.name)


def test_async_llm_takes_a_repo_id(hub_env, no_network):
    _, main, _ = hub_env
    expected = _greedy(LLM(str(main), **ENGINE))
    engine = AsyncLLM(REPO, in_process=True, start_timeout=120, **ENGINE)
    try:

        async def run():
            return [out async for out in engine.generate(PROMPT, GREEDY, "r0")][-1]

        assert asyncio.run(run()).outputs[0].token_ids == expected
    finally:
        engine.shutdown()
    assert no_network == []


def test_download_dir_is_the_cache_looked_in(hub, tmp_path, monkeypatch):
    """vLLM's download_dir is the hub cache its downloads went to (snapshot_download's
    cache_dir): a repo is looked up there instead of HF_HUB_CACHE's, and a miss names it."""
    cache, main, _ = hub
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert EngineArgs(model=REPO, download_dir=str(cache)).model_dir() == str(main)
    with pytest.raises(CheckpointNotFound, match=f"in the local cache {tmp_path} \\(download_dir\\)"):
        EngineArgs(model=REPO, download_dir=str(tmp_path)).model_dir()
    with pytest.raises(ValueError, match="download_dir must be None or a directory path"):
        EngineArgs(model=REPO, download_dir=" ")


def test_a_draft_models_repo_id_loads_its_cached_snapshot(hub_env, no_network):
    """speculative_config's draft "model", as vLLM takes it, may be a cached repo id too: the
    target drafting for itself accepts every draft and keeps its greedy tokens; an uncached one
    is the CheckpointNotFound naming speculative_config.model and the download."""
    _, main, _ = hub_env
    spec = {"method": "draft_model", "model": REPO, "num_speculative_tokens": 2}
    llm = LLM(REPO, speculative_config=spec, **ENGINE)
    assert _greedy(llm) == _greedy(LLM(str(main), **ENGINE))
    assert llm.engine.draft_model is not None and llm.engine.stats.spec_decode.num_accepted_tokens > 0
    with pytest.raises(
        CheckpointNotFound, match=r"^speculative_config\.model: draft model 'org/none' does not"
    ):
        LLM(REPO, speculative_config={**spec, "model": "org/none"}, **ENGINE)
    assert no_network == []


def test_a_draft_revision_picks_the_drafts_snapshot(hub_env, no_network):
    """speculative_config's own revision (vLLM's key; refused before) picks the draft's snapshot,
    whatever the target's revision: a v2 draft under a main target drafts with other weights,
    and the target's greedy tokens stay its own. A revision the cache lacks is named."""
    _, main, v2 = hub_env
    spec = {"method": "draft_model", "model": REPO, "revision": "v2", "num_speculative_tokens": 2}
    llm = LLM(REPO, speculative_config=spec, **ENGINE)
    assert llm.engine._draft_dir() == str(v2) and llm.engine.args.model_dir() == str(main)
    assert _greedy(llm) == _greedy(LLM(str(main), **ENGINE))
    with pytest.raises(CheckpointNotFound, match=r"^speculative_config\.model: .*revision 'v3'"):
        LLM(REPO, speculative_config={**spec, "revision": "v3"}, **ENGINE)
    assert no_network == []
