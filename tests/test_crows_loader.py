"""CrowS-Pairs loader: the real file, line-ending normalisation, and malformed input."""
from __future__ import annotations

import pandas as pd
import pytest

from biasflow.data.crows_pairs import BIAS_TYPES, read_crows_pairs
from biasflow.errors import DataFormatError


def test_real_file_counts(crows_csv):
    df = read_crows_pairs(crows_csv)
    assert len(df) == 1508
    assert set(df.category) == set(BIAS_TYPES)
    assert df.category.value_counts()["race-color"] == 516  # Nangia et al. Table 1
    assert df.direction.value_counts().to_dict() == {"stereo": 1290, "antistereo": 218}
    assert not df.sent_more.str.contains("\r").any()


def test_crlf_and_lf_copies_give_identical_items(crows_csv, tmp_path):
    lf = tmp_path / "lf.csv"
    lf.write_bytes(crows_csv.read_bytes().replace(b"\r\n", b"\n"))
    pd.testing.assert_frame_equal(read_crows_pairs(crows_csv), read_crows_pairs(lf))


def write(tmp_path, text):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    return p


HEADER = ",sent_more,sent_less,stereo_antistereo,bias_type,annotations,anon_writer,anon_annotators\n"


def test_malformed_rows_name_file_and_line(tmp_path):
    good = '0,"A b.","A c.",stereo,gender,[],a,[]\n'
    p = write(tmp_path, HEADER + good + '1,"A b.","A c.",sideways,gender,[],a,[]\n')
    with pytest.raises(DataFormatError, match=r"bad.csv, line 3: stereo_antistereo='sideways'"):
        read_crows_pairs(p)
    p = write(tmp_path, HEADER + good + '1,"A b.","A c.",stereo,colour,[],a,[]\n')
    with pytest.raises(DataFormatError, match=r"line 3: bias_type='colour'"):
        read_crows_pairs(p)
    p = write(tmp_path, HEADER + '0,"A b."\n')
    with pytest.raises(DataFormatError, match=r"line 2: wrong number of fields"):
        read_crows_pairs(p)
    p = write(tmp_path, "sent_more,stereo_antistereo\nx,stereo\n")
    with pytest.raises(DataFormatError, match=r"missing column\(s\) \['sent_less', 'bias_type'\]"):
        read_crows_pairs(p)
    p = write(tmp_path, HEADER + '0,"  ","A c.",stereo,gender,[],a,[]\n')
    with pytest.raises(DataFormatError, match=r"line 2: empty sent_more"):
        read_crows_pairs(p)


@pytest.mark.parametrize("encoding, message", [("latin-1", r"is not UTF-8: byte 0xe9 at offset \d+ \(line 2\)"),
                                               ("utf-16", "is UTF-16 text")])
def test_non_utf8_files_name_the_file(tmp_path, encoding, message):
    from biasflow.data.crows_pairs import read_crows_pairs
    from biasflow.data.prompts import read_prompts_file
    from biasflow.errors import DataFormatError

    text = ",sent_more,sent_less,stereo_antistereo,bias_type\n0,Le café est noir.,Le thé est noir.,stereo,race-color\n"
    bad = tmp_path / "pairs.csv"
    bad.write_bytes(text.encode(encoding))
    with pytest.raises(DataFormatError, match=rf"CrowS-Pairs CSV {bad} {message}"):
        read_crows_pairs(bad)
    prompts = tmp_path / "prompts.csv"
    prompts.write_bytes("prompt\nUn café\n".encode(encoding))
    with pytest.raises(DataFormatError, match=rf"prompts file {prompts} "):
        read_prompts_file(prompts)


def test_a_repeated_row_is_kept_and_named(crows_csv, tmp_path, caplog):
    """A row duplicated in the source (under a new id) is counted once each, as the reference does, with a warning
    that names both ids; the prepare record lists them. The real file repeats one pair (ids 1459 and 1502)."""
    import json
    import logging

    import pandas as pd

    from biasflow.io import sha256_file
    from biasflow.stages import prepare

    raw = pd.read_csv(crows_csv, index_col=0).head(20)
    raw.loc[20] = raw.loc[3]  # row 3 again, as id 20
    path = tmp_path / "crows.csv"
    raw.to_csv(path)
    cfg = {"loader": "crows_pairs", "files": {"csv": {"sources": [{"url": path.as_uri(), "sha256": sha256_file(path)}]}}}
    out = tmp_path / "items.parquet"
    with caplog.at_level(logging.WARNING):
        items = prepare("crows_pairs", cfg, {"csv": str(path)}, str(out))
    assert len(items) == 21
    assert "crows_pairs: 1 item(s) repeat another item's content" in caplog.text
    assert "crows-3 = crows-20" in caplog.text
    assert json.loads((tmp_path / "items.parquet.meta.json").read_text())["repeated_items"] == [["crows-3", "crows-20"]]

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        real = {"csv": {"sources": [{"url": crows_csv.as_uri(), "sha256": sha256_file(crows_csv)}]}}
        prepare("crows_pairs", dict(cfg, files=real), {"csv": str(crows_csv)}, str(out))  # the real file
    assert "crows-1459 = crows-1502" in caplog.text


def test_repeated_items_compare_missing_values_lists_and_structs_by_value():
    """Missing values (None, NaN, pd.NA in pandas 3's string columns), lists and structs: equal by value, and a
    missing value is not the text "nan"."""
    from biasflow.stages import repeated_items

    items = pd.DataFrame({
        "item_id": ["a", "b", "c", "d", "e", "f"],
        "text": pd.array(["x", "x", "x", "x", "nan", None], dtype="string"),
        "score": [float("nan"), float("nan"), 1.0, 1.0, float("nan"), float("nan")],
        "tags": [["p", "q"], ["p", "q"], ["p"], ["p"], ["p"], ["p"]],
        "info": [{"k": [1, 2]}, {"k": [1, 2]}, {"k": [1]}, {"k": [3]}, {"k": [1]}, {"k": [1]}],
    })
    assert repeated_items(items) == [["a", "b"]]
    assert repeated_items(items.assign(info=None)) == [["a", "b"], ["c", "d"]]
