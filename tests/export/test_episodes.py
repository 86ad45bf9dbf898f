"""The episode export: `etl export --format episodes`, the XML config, EpisodeDataLoader (must-haves)."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from etl.cli import main
from etl.errors import EtlError
from etl.export.episode_loader import EpisodeDataLoader
from etl.export.training_xml import TrainingConfig
from tests.loader.conftest import random_examples, write_dst

F, T_ = False, True
SMALL = [([5, 6, 7], [F, T_, T_]), ([8, 9], [F, T_]), ([1, 2, 3, 4], [F, F, T_, T_]), ([11], [F])]


@pytest.fixture
def episodes(tmp_path: Path) -> Path:
    """SMALL as train (row groups of 2), two rows as val, exported through the CLI."""
    dst = write_dst(
        tmp_path / "dst",
        {"train": SMALL, "val": SMALL[:2]},
        rows_per_group=2,
        manifest={"pad_id": 0, "eot_id": 99},
    )
    assert main(["export", str(dst), str(tmp_path / "ep"), "--format", "episodes"]) == 0
    return tmp_path / "ep"


def sft(**flags: object) -> TrainingConfig:
    return TrainingConfig(dataset_mode="sft_episode", **flags)  # type: ignore[arg-type]


def test_export_writes_the_episode_binary_layout(
    episodes: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = episodes / "train"
    assert np.fromfile(train / "tokens.bin", dtype=np.uint32).tolist() == [
        5,
        6,
        7,
        8,
        9,
        1,
        2,
        3,
        4,
        11,
    ]
    assert np.fromfile(train / "mask.bin", dtype=np.uint8).tolist() == [
        0,
        1,
        1,
        0,
        1,
        0,
        0,
        1,
        1,
        0,
    ]
    assert (train / "episodes.idx").stat().st_size == 16 * 4  # 16-byte records
    idx = np.fromfile(train / "episodes.idx", dtype=np.uint64).reshape(-1, 2)
    assert idx.tolist() == [[0, 3], [3, 2], [5, 4], [9, 1]]
    assert np.fromfile(episodes / "val" / "episodes.idx", dtype="<u8").tolist() == [0, 3, 3, 2]
    meta = json.loads((episodes / "meta.json").read_text())
    assert meta["pad_id"] == 0 and meta["eot_id"] == 99
    assert meta["splits"] == {
        "train": {"episodes": 4, "tokens": 10},
        "val": {"episodes": 2, "tokens": 5},
    }
    assert (
        main(
            [
                "export",
                str(episodes.parent / "dst"),
                str(episodes.parent / "again"),
                "--format",
                "episodes",
                "--splits",
                "val",
                "--no-mask",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("val: 2 episodes, 5 tokens -> ")
    assert sorted(p.name for p in (episodes.parent / "again").iterdir()) == ["_export.json", "meta.json", "val"]
    assert not (episodes.parent / "again" / "val" / "mask.bin").exists()


def test_export_cli_rejects_unknown_formats_and_missing_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path), str(tmp_path / "o"), "--format", "parquet9"])
    assert (
        main(["export", str(tmp_path / "none"), str(tmp_path / "o"), "--format", "episodes"]) == 2
    )
    assert "etl run" in capsys.readouterr().err


def test_padding_short_episode_and_zero_mask_on_padding(episodes: Path) -> None:
    loader = EpisodeDataLoader(episodes, sft(epoch_shuffle=False), batch_size=1, block_size=5)
    x, y, mask = loader.get_batch("train")  # episode 0: t=[5,6,7], L = 6
    assert x.shape == y.shape == mask.shape == (1, 5)
    assert x.dtype == y.dtype == torch.int64 and mask.dtype == torch.float32
    assert x.tolist() == [[5, 6, 7, 0, 0]]
    assert y.tolist() == [[6, 7, 0, 0, 0]]
    assert mask.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]


def test_truncation_long_episode_keeps_first_block_plus_one(episodes: Path) -> None:
    loader = EpisodeDataLoader(episodes, sft(epoch_shuffle=False), batch_size=3, block_size=2)
    x, y, mask = loader.get_batch("train")  # episodes 0, 1, 2 (3 is < 2 tokens: filtered)
    assert x.tolist() == [[5, 6], [8, 9], [1, 2]]
    assert y.tolist() == [[6, 7], [9, 0], [2, 3]]  # [1,2,3,4][:3] -> x=[1,2], y=[2,3]
    assert mask.tolist() == [[1, 1], [1, 0], [0, 1]]


def test_mask_alignment_against_the_files(tmp_path: Path) -> None:
    examples = random_examples(40, seed=8, max_len=30)
    dst = write_dst(tmp_path / "d", {"train": examples}, rows_per_group=7, manifest={"seq_len": 30})
    assert main(["export", str(dst), str(tmp_path / "ep"), "--format", "episodes"]) == 0
    tokens = np.fromfile(tmp_path / "ep/train/tokens.bin", dtype=np.uint32)
    maskf = np.fromfile(tmp_path / "ep/train/mask.bin", dtype=np.uint8)
    idx = np.fromfile(tmp_path / "ep/train/episodes.idx", dtype=np.uint64).reshape(-1, 2)
    loader = EpisodeDataLoader(tmp_path / "ep", sft(), batch_size=8, block_size=12)
    for _ in range(6):
        x, y, mask = loader.get_batch("train")
        assert mask.shape == y.shape
        for row, ep in enumerate(loader.last_episode_ids["train"]):
            start, n = int(idx[ep, 0]), int(idx[ep, 1])
            assert (start, n) == (sum(len(e[0]) for e in examples[:ep]), len(examples[ep][0]))
            for i in range(12):  # y[i] is token i+1 of the episode; mask[i] is mask.bin there
                inside = i + 1 < n
                assert y[row, i] == (tokens[start + i + 1] if inside else 0)
                assert mask[row, i] == (maskf[start + i + 1] if inside else 0)
                assert x[row, i] == (tokens[start + i] if i < n else 0)


def ids_per_epoch(loader: EpisodeDataLoader, batches: int) -> list[int]:
    out = []
    for _ in range(batches):
        loader.get_batch("train")
        out += loader.last_episode_ids["train"].tolist()
    return out


@pytest.fixture
def many(tmp_path: Path) -> Path:
    dst = write_dst(tmp_path / "m", {"train": random_examples(23, seed=4)}, rows_per_group=5)
    main(["export", str(dst), str(tmp_path / "mep"), "--format", "episodes"])
    return tmp_path / "mep"


def test_epoch_determinism_same_seed_same_order(many: Path) -> None:
    runs = [
        ids_per_epoch(EpisodeDataLoader(many, sft(epoch_seed=7), batch_size=5, block_size=4), 8)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    # drop_last: 4 batches of 5 per epoch, order = permutation seeded by epoch_seed + epoch.
    assert runs[0][:20] == np.random.default_rng(7 + 0).permutation(23)[:20].tolist()
    assert runs[0][20:40] == np.random.default_rng(7 + 1).permutation(23)[:20].tolist()
    other = ids_per_epoch(EpisodeDataLoader(many, sft(epoch_seed=8), batch_size=5, block_size=4), 8)
    assert other != runs[0]


def test_epoch_coverage_without_drop_last_every_episode_once_per_epoch(many: Path) -> None:
    cfg = sft(epoch_drop_last=False, epoch_seed=3)
    loader = EpisodeDataLoader(many, cfg, batch_size=5, block_size=4)
    assert loader.batches_per_epoch("train") == 5
    served = ids_per_epoch(loader, 14)  # 70 ids: epochs 0, 1, 2 and part of 3; shapes stay fixed
    for e in range(3):
        assert sorted(served[23 * e : 23 * (e + 1)]) == list(range(23))


def test_epoch_coverage_with_drop_last_and_no_shuffle(many: Path) -> None:
    loader = EpisodeDataLoader(many, sft(epoch_shuffle=False), batch_size=5, block_size=4)
    assert ids_per_epoch(loader, 5) == list(range(20)) + list(range(5))


def test_random_mode_draws_with_replacement_deterministically(many: Path) -> None:
    make = lambda: EpisodeDataLoader(
        many, sft(batch_sampling_mode="random", epoch_seed=2), batch_size=5, block_size=4
    )
    a, b = ids_per_epoch(make(), 20), ids_per_epoch(make(), 20)
    assert a == b and min(a) >= 0 and max(a) < 23
    assert len(set(a)) < len(a) and len(set(a)) > 15


def test_min_tokens_filter_and_init_and_epoch_log_lines(
    episodes: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="etl.loader.episodes")
    loader = EpisodeDataLoader(episodes, sft(epoch_shuffle=False), batch_size=3, block_size=4)
    assert loader.episode_ids["train"].tolist() == [0, 1, 2]  # episode 3 has 1 token < 2
    assert (
        "[EpisodeLoader] init split=train mode=sft_episode sampling=epoch episodes=4 kept=3 "
        "(min_tokens=2) tokens=10 mask=true"
    ) in caplog.messages
    loader.get_batch("train")
    loader.get_batch("train")
    tail = "episodes=3 batches=1 shuffle=false drop_last=true pad_id=0 mask=true"
    assert caplog.messages[-2:] == [
        f"[EpisodeLoader] split=train epoch=0 {tail}",
        f"[EpisodeLoader] split=train epoch=1 {tail}",
    ]
    loose = EpisodeDataLoader(episodes, sft(episode_min_tokens=0), batch_size=4, block_size=4)
    assert len(loose.episode_ids["train"]) == 4


def test_missing_or_incomplete_mask_returns_x_y_and_warns_once(episodes: Path) -> None:
    (episodes / "train" / "mask.bin").unlink()
    (episodes / "val" / "mask.bin").write_bytes(b"\x01")  # 1 byte for 5 tokens: incomplete
    loader = EpisodeDataLoader(episodes, sft(), batch_size=2, block_size=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(loader.get_batch("train")) == 2
        assert len(loader.get_batch("val")) == 2
    assert len(caught) == 1 and "mask.bin absent" in str(caught[0].message)
    assert loader.splits["val"].mask_note.startswith("mask.bin has 1 bytes for 5 tokens")
    no_mask = EpisodeDataLoader(episodes, sft(use_loss_mask=False), batch_size=2, block_size=3)
    assert len(no_mask.get_batch("val")) == 2


def test_pad_id_order_config_then_eos_then_export(episodes: Path) -> None:
    assert (
        EpisodeDataLoader(
            episodes, sft(pad_token_id=50256), batch_size=1, block_size=2, eos_id=7
        ).pad_id
        == 50256
    )
    assert EpisodeDataLoader(episodes, sft(), batch_size=1, block_size=2, eos_id=7).pad_id == 7
    assert EpisodeDataLoader(episodes, sft(), batch_size=1, block_size=2).pad_id == 0
    (episodes / "meta.json").unlink()
    with pytest.raises(EtlError, match="pad_token_id"):
        EpisodeDataLoader(episodes, sft(), batch_size=1, block_size=2)


def test_token_stream_gives_random_contiguous_windows(episodes: Path) -> None:
    stream = np.fromfile(episodes / "train" / "tokens.bin", dtype=np.uint32).tolist()
    loader = EpisodeDataLoader(episodes, TrainingConfig(epoch_seed=5), batch_size=16, block_size=4)
    assert loader.sampling == "random"
    seen = set()
    for _ in range(5):
        batch = loader.get_batch("train")
        assert len(batch) == 2
        x, y = batch
        for xr, yr in zip(x.tolist(), y.tolist(), strict=True):
            i = next(k for k in range(len(stream) - 4) if stream[k : k + 4] == xr)
            assert yr == stream[i + 1 : i + 5]  # crosses episode boundaries: pretraining windows
            seen.add(i)
    assert seen == set(range(len(stream) - 4))  # every start 0..N-T-1 is reachable
    again = EpisodeDataLoader(episodes, TrainingConfig(epoch_seed=5), batch_size=16, block_size=4)
    assert (
        again.get_batch("train")[0].tolist()
        == EpisodeDataLoader(episodes, TrainingConfig(epoch_seed=5), batch_size=16, block_size=4)
        .get_batch("train")[0]
        .tolist()
    )


def test_state_dict_resumes_episode_loader(many: Path) -> None:
    cfg = sft(epoch_drop_last=False)
    full = EpisodeDataLoader(many, cfg, batch_size=5, block_size=4)
    expected = [full.get_batch("train")[0].tolist() for _ in range(9)]
    first = EpisodeDataLoader(many, cfg, batch_size=5, block_size=4)
    head = [first.get_batch("train")[0].tolist() for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))
    second = EpisodeDataLoader(many, cfg, batch_size=5, block_size=4)
    second.load_state_dict(state)
    assert head + [second.get_batch("train")[0].tolist() for _ in range(5)] == expected


XML = """<config><model><n_layer>2</n_layer></model><training>
  <batch_size>4</batch_size><block_size>8</block_size>
  <dataset_mode>sft_episode</dataset_mode>
  <batch_sampling_mode>epoch</batch_sampling_mode>
  <epoch_shuffle>false</epoch_shuffle>
  <epoch_drop_last>False</epoch_drop_last>
  <epoch_seed>42</epoch_seed>
  <pad_token_id>50256</pad_token_id>
  <episode_min_tokens>3</episode_min_tokens>
  <learning_rate>3e-4</learning_rate>
</training></config>"""


def test_xml_config_reads_every_training_flag(tmp_path: Path, episodes: Path) -> None:
    path = tmp_path / "train.xml"
    path.write_text(XML)
    for source in (XML, path, str(path)):
        cfg = TrainingConfig.from_xml(source)
        assert (
            cfg.dataset_mode,
            cfg.batch_sampling_mode,
            cfg.epoch_shuffle,
            cfg.epoch_drop_last,
            cfg.epoch_seed,
            cfg.pad_token_id,
            cfg.episode_min_tokens,
        ) == ("sft_episode", "epoch", False, False, 42, 50256, 3)
    loader = EpisodeDataLoader(episodes, path)
    assert (loader.batch_size, loader.block_size, loader.pad_id) == (4, 8, 50256)
    assert loader.episode_ids["train"].tolist() == [0, 2]  # min_tokens 3


def test_xml_defaults_and_errors() -> None:
    cfg = TrainingConfig.from_xml("<training/>")
    assert (
        cfg.dataset_mode,
        cfg.sampling,
        cfg.epoch_shuffle,
        cfg.epoch_drop_last,
        cfg.epoch_seed,
        cfg.pad_token_id,
        cfg.episode_min_tokens,
    ) == ("token_stream", "random", True, True, 1337, None, 2)
    assert (
        TrainingConfig.from_xml(
            "<training><dataset_mode>sft_episode</dataset_mode></training>"
        ).sampling
        == "epoch"
    )
    with pytest.raises(EtlError, match="<epoch_shuffle> must be true or false"):
        TrainingConfig.from_xml("<training><epoch_shuffle>maybe</epoch_shuffle></training>")
    with pytest.raises(EtlError, match="<epoch_seed> must be an integer"):
        TrainingConfig.from_xml("<training><epoch_seed>x</epoch_seed></training>")
    with pytest.raises(EtlError, match="dataset_mode"):
        TrainingConfig.from_xml("<training><dataset_mode>stream</dataset_mode></training>")
    with pytest.raises(EtlError, match="no <training> element"):
        TrainingConfig.from_xml("<config/>")
    with pytest.raises(EtlError, match="cannot read"):
        TrainingConfig.from_xml("<training>")


def test_reexport_into_the_same_out_drops_splits_it_did_not_write(tmp_path: Path) -> None:
    both = write_dst(
        tmp_path / "both", {"train": random_examples(5, seed=1), "val": random_examples(3, seed=2)}
    )
    only_train = write_dst(tmp_path / "train", {"train": random_examples(4, seed=3)})
    out = tmp_path / "ep"
    assert main(["export", str(both), str(out), "--format", "episodes"]) == 0
    assert (out / "val" / "tokens.bin").exists()
    assert main(["export", str(only_train), str(out), "--format", "episodes"]) == 0
    assert not (out / "val" / "tokens.bin").exists()  # an old val must not pass for this data's
    assert set(json.loads((out / "meta.json").read_text())["splits"]) == {"train"}


def test_export_into_a_file_is_one_clear_line(
    episodes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "a_file"
    target.write_text("x")
    assert main(["export", str(episodes.parent), str(target), "--format", "episodes"]) == 2
    assert "is a file; pass a folder" in capsys.readouterr().err
