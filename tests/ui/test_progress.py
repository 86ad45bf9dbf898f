"""The progress bar advances with the chunks processed, not with what the reader read ahead."""

from __future__ import annotations

import json
from pathlib import Path

import etl.pipeline.chunk
from etl.cli import main
from etl.ui.progress import Progress


def test_the_bar_counts_work_done(tmp_path: Path, monkeypatch) -> None:
    line = json.dumps({"messages": [{"role": "user", "content": "q" * 60},
                                    {"role": "assistant", "content": "a" * 60}]}) + "\n"
    src = tmp_path / "chats.jsonl"
    src.write_text(line * 600)  # ~100 KB: ten chunks of 10 KB
    done, seen = [0], []
    real_chunk, real_position = etl.pipeline.chunk.process_chunk, Progress.file_position

    def chunk(source, parsed, ctx, *started) -> None:
        real_chunk(source, parsed, ctx, *started)
        done[0] += parsed.num_rows

    def position(self: Progress, offset: int) -> None:
        seen.append((offset, done[0] * len(line)))
        real_position(self, offset)

    monkeypatch.setattr(etl.pipeline.chunk, "process_chunk", chunk)
    monkeypatch.setattr(Progress, "file_position", position)
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet", "--chunk-mb", "0.01"]) == 0
    per_chunk = [(offset, processed) for offset, processed in seen if processed < len(line) * 600]
    assert len(per_chunk) >= 5
    # The bar stands where the processed records end (the reader keeps < 1 line of read-ahead).
    assert all(0 <= offset - processed < len(line) for offset, processed in per_chunk)
