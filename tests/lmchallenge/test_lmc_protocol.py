"""Models as processes: a bash model, crashes, hangs, garbage, and the n-gram server."""
import subprocess
import sys
import textwrap
import time

import pytest

from biasflow.lmchallenge.games import run_game
from biasflow.lmchallenge.ngram import NgramModel
from biasflow.lmchallenge.process import ProcessModel
from biasflow.lmchallenge.protocol import ProtocolError, format_predict, parse_response
from biasflow.lmchallenge.stats import stats
from biasflow.lmchallenge.text import Message


def script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    p.chmod(0o755)
    return str(p)


# A bash model: next words "the cat dog" (scores 0 -1 -2); with candidates, each scores -(its length);
# it counts train lines and answers "trained N" as a prediction so the test can see they arrived.
BASH_MODEL = r"""
    n=0
    while IFS= read -r line; do
      IFS=$'\t' read -r -a f <<< "$line"
      case "${f[0]}" in
        predict)
          if [ "${#f[@]}" -gt 2 ]; then
            out=""
            for c in "${f[@]:2}"; do out+="${c}"$'\t'"-${#c}"$'\t'; done
            printf '%s\n' "${out%$'\t'}"
          elif [ "${f[1]}" = "count" ]; then printf 'trained %s\t0\n' "$n"
          else printf 'the\t0\tcat\t-1\tdog\t-2\n'; fi ;;
        train) n=$((n+1)) ;;
        clear) n=0 ;;
      esac
    done
"""


def test_bash_model_speaks_the_protocol(tmp_path):
    with ProcessModel(["bash", script(tmp_path, "model.sh", BASH_MODEL)], timeout=10) as m:
        assert m.predict("I am your ") == [("the", 0.0), ("cat", -1.0), ("dog", -2.0)]
        assert m.predict("I am your ", ["guest", "ox"]) == [("guest", -5.0), ("ox", -2.0)]
        m.train("a line")
        m.train("another")
        assert m.predict("count") == [("trained 2", 0.0)]
        m.clear()
        assert m.predict("count") == [("trained 0", 0.0)]
        s = stats(run_game(m, [Message(None, "the dog")], "wc", next_word_only=True))
        assert s["prediction"]["mrr"] == pytest.approx((1 + 1 / 3) / 2)
        proc = m.proc
    assert proc.poll() is not None  # closed and reaped


def test_crash_names_the_request(tmp_path):
    crash = script(tmp_path, "crash.sh", """
        read -r line; printf 'a\\t0\\n'
        read -r line; echo "dying on: $line" >&2; exit 3
    """)
    with ProcessModel(["bash", crash], timeout=10) as m:
        m.predict("first ")
        with pytest.raises(ProtocolError) as e:
            m.predict("second context ")
    msg = str(e.value)
    assert "crashed" in msg and "exit code 3" in msg and "second context" in msg and "dying on" in msg
    assert m.proc.poll() == 3


def test_hang_times_out_and_is_killed(tmp_path):
    hang = script(tmp_path, "hang.sh", """
        sleep 60 &
        echo $! > "$(dirname "$0")/child.pid"
        read -r line; sleep 60
    """)
    m = ProcessModel(["bash", hang], timeout=0.5, startup_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match=r"did not answer within 0.5 s on request 'predict\\tslow "):
        m.predict("slow ")
    assert time.monotonic() - t0 < 5
    assert m.proc.poll() is not None  # the model was killed and reaped
    child = int((tmp_path / "child.pid").read_text())
    assert _dies(child)  # its background child went with its process group
    m.close()


def _dies(pid, within=5.0):
    """True once ``pid`` is gone or a zombie (dead, waiting for init to reap it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("answer, why", [("a\\t0\\tb", "odd number"), ("a\\tbig", "not a number"),
                                         ("a\\tinf\\tb\\t-inf", "not a log-probability"),
                                         ("a\\tnan", "not a log-probability")])
def test_garbage_answer(tmp_path, answer, why):
    bad = script(tmp_path, "bad.sh", f"while read -r line; do printf '{answer}\\n'; done\n")
    with ProcessModel(["bash", bad], timeout=10) as m:
        with pytest.raises(ProtocolError, match=why) as e:
            m.predict("hello ")
    assert "predict\\thello" in str(e.value) and "malformed" in str(e.value)


def test_answer_to_train_is_an_error(tmp_path):
    chatty = script(tmp_path, "chatty.sh", "while read -r line; do echo ok; done\n")
    with ProcessModel(["bash", chatty], timeout=10) as m:
        m.train("some line")
        deadline = time.monotonic() + 20  # until its stray answer has been read (a fixed sleep was racy under load)
        while m._lines.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ProtocolError, match="answered a command that takes no answer.*train"):
            m.predict("x")


def test_missing_command_is_a_clear_error():
    with pytest.raises(ProtocolError, match="cannot start model"):
        ProcessModel(["/nonexistent/model-binary"])


def test_protocol_fields():
    assert format_predict("I am ", ["a", "b"]) == "predict\tI am \ta\tb\n"
    assert parse_response("\n") == []
    with pytest.raises(ValueError, match="TAB"):
        format_predict("a\tb")


def test_ngram_server_matches_in_process(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n")
    local = NgramModel(order=3).fit(train.read_text().splitlines())
    cmd = [sys.executable, "-m", "biasflow.lmchallenge.ngram", "--order", "3", "--train", str(train)]
    with ProcessModel(cmd, timeout=30) as remote:
        for ctx in ["", "the ", "the c", "on the "]:
            got, want = remote.predict(ctx), local.predict(ctx)
            assert [w for w, _ in got] == [w for w, _ in want]
            assert [s for _, s in got] == pytest.approx([s for _, s in want])
        assert remote.predict("the ", ["cat", "zebra"]) == [("cat", pytest.approx(local.predict("the ", ["cat"])[0][1]))]
    with subprocess.Popen(cmd[:3] + ["--order", "0", "--train", str(train)], stderr=subprocess.PIPE, text=True) as p:
        assert "--order must be >= 1" in p.communicate(timeout=30)[1]
