"""docs/simulation.md's "Compressed reductions: when they pay": its command, run as written, prints the table the
doc shows, and the sentence that states the result holds for it."""
import re
import subprocess
import sys

from paths import REPO as REPO_ROOT

DOC = REPO_ROOT / "docs" / "simulation.md"
SENTENCE = ("On 1 Gb/s links fp16 compression makes the step 1.41 to 1.78 times faster, on 10 Gb/s 1.06 to 1.25 "
            "times; at\n100 Gb/s it gains at most 2.1%, and at 400 Gb/s it loses (0.994x to 0.999x)")


def _section():
    text = DOC.read_text()
    return text.split("## Compressed reductions: when they pay", 1)[1].split("\n## ", 1)[0]


def test_the_command_prints_the_docs_table_and_the_sentence_holds():
    section = _section()
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    assert command == "python scripts/experiments/compression_sweep.py"
    out = subprocess.run([sys.executable, *command.split()[1:]], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert "\n".join(table) in section                      # the doc shows what the command prints
    assert SENTENCE in section
    ratios = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        ratios.setdefault(float(cells[2]), []).append(float(cells[6].rstrip("x")))
    assert set(ratios) == {1.0, 10.0, 100.0, 400.0}
    assert (min(ratios[1.0]), max(ratios[1.0])) == (1.413, 1.775)        # "1.41 to 1.78"
    assert round(min(ratios[10.0]), 2) == 1.06 and round(max(ratios[10.0]), 2) == 1.25
    assert 1.0 < min(ratios[100.0]) and max(ratios[100.0]) <= 1.021       # "gains at most 2.1%"
    assert (min(ratios[400.0]), max(ratios[400.0])) == (0.994, 0.999)   # "loses (0.994x to 0.999x)"
