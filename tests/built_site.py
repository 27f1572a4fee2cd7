"""The course's web site, built once per test session, as ``python -m labkit docs --executed``
builds it, from the lessons this session executed at their classroom defaults
(``tests/lessons.py``: every lesson runs once per session whichever test asks first).

    site = built_site()            # the site's folder; site / "lessons" / "00_your_cluster.html"

``tests/test_docs.py`` checks its pages; ``tests/test_browser.py`` opens it in Chromium. The
site is removed at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

from labkit.classroom.site import build_site
from tests.lessons import STEMS, lesson

# Seconds for a test that may be the session's first to ask for the lessons: it then waits
# for all of them (about 15 minutes on 2 cores); in the whole suite the claims tests, which
# run before it, have executed them already and the build alone takes well under a minute.
SITE_TIMEOUT_S = 2400
_SITE: dict = {}


def built_site() -> Path:
    """The site's folder (built on first use; a lesson that failed fails the caller)."""
    if "path" not in _SITE:
        executed = {lesson(stem).path.parent for stem in STEMS}
        assert len(executed) == 1, f"the lessons were executed into several folders: {executed}"
        out = Path(tempfile.mkdtemp(prefix="labkit-site-"))
        owner = os.getpid()  # a forked rank inherits the hook: only this process removes it
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(out, True))
        start = time.perf_counter()
        build_site(out, executed.pop(), say=lambda line: None)
        _SITE.update(path=out, seconds=time.perf_counter() - start)
        print(f"site built in {_SITE['seconds']:.1f} s")
    return _SITE["path"]
