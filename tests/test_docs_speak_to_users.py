"""The measured pages state the machine, its load and the dates, never who else was on the machine or how its
users took turns on it (`grep -rniw "sessions\\?" docs README.md` is tests/launch/test_readme.py's)."""
import os
import re

from paths import REPO_DIR as REPO

PAGES = ["README.md", *(os.path.join("docs", name) for name in sorted(os.listdir(os.path.join(REPO, "docs")))
                        if name.endswith(".md"))]
# who else was on the machine, and turn-taking between them
WHO_AND_TURNS = re.compile(r"other (users|developers?)\b|another (user|developer)'s jobs|developers' (test|jobs)"
                           r"|held off|(window|turns?) agreed|agreed between them|took turns|taking turns"
                           r"|shared with (other|another)|no quiet time left", re.I)


def test_the_pattern_finds_what_it_is_for():
    assert WHO_AND_TURNS.search("the machine's other users held off (a quiet window agreed between them)")
    assert WHO_AND_TURNS.search("2 cores shared with another developer's jobs")
    assert not WHO_AND_TURNS.search("load average 4.3-4.6 (other jobs on the VM); a user's own frames")


def test_measured_pages_name_the_load_not_who_shared_the_machine():
    hits = []
    for name in PAGES:
        for number, line in enumerate(open(os.path.join(REPO, name), encoding="utf-8"), 1):
            if WHO_AND_TURNS.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:120]}")
    assert len(PAGES) > 10 and not hits, hits
