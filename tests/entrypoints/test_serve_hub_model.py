"""`enginespec serve org/name`, as vLLM users start a server: the snapshot in the local hub cache
is served, under the id as given (/v1/models' id and root, as vLLM shows them), with the
snapshot directory's greedy tokens; the server process finds the cache through HF_HUB_CACHE
and downloads nothing (worker/hub_cache.py)."""

from __future__ import annotations

import os

import pytest

from enginespec.llm import LLM
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import make_checkpoint, write_hub_cache
from tests.entrypoints.remote_server import RemoteServer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

REPO = "enginespec-test/tiny-qwen3"
ENGINE = ["--impl", "fast", "--num-blocks", "64", "--max-num-seqs", "4", "--dtype", "float32"]
PROMPT = [5, 9, 14, 20, 33, 41]


def test_serve_takes_a_cached_repo_id_and_shows_it_as_given(tmp_path):
    cache = tmp_path / "hub"
    snapshot = write_hub_cache(make_checkpoint("qwen3", tmp_path / "src"), cache, REPO)
    env = dict(os.environ, HF_HUB_CACHE=str(cache), TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.pop("HF_HUB_OFFLINE", None)
    llm = LLM(str(snapshot), impl="fast", device="cpu", num_blocks=64, max_num_seqs=4, dtype="float32")
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    expected = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0].token_ids
    server = RemoteServer(REPO, ENGINE, env=env)
    try:
        client = server.client()
        (card,) = client.models.list().data
        assert (card.id, card.root) == (REPO, REPO)
        resp = client.completions.create(
            model=REPO,
            prompt=PROMPT,
            max_tokens=8,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        assert resp.choices[0].token_ids == expected
    finally:
        assert server.terminate() == 0
