"""The sandbox's login profile: the host's /etc/profile with only its ``id -u`` rewritten."""

from __future__ import annotations

import stat
from pathlib import Path

from services.sandbox.login_profile import write_login_profile

DEBIAN = '''if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin"
fi
export PATH
echo "$(id -un)"
'''


def test_only_the_id_question_is_rewritten(tmp_path: Path) -> None:
    source = tmp_path / "profile"
    source.write_text(DEBIAN)
    out = write_login_profile(tmp_path, source)
    assert out is not None and out.parent == tmp_path
    assert out.read_text() == DEBIAN.replace('"$(id -u)"', '"${EUID:-$(id -u)}"')
    assert '"$(id -un)"' in out.read_text()  # other questions are left as they are
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # sandbox uids bind it
    assert source.read_text() == DEBIAN and not list(tmp_path.glob(".profile-*"))


def test_nothing_is_bound_when_there_is_nothing_to_rewrite(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text('PATH="/usr/bin:/bin"\nexport PATH\n')
    assert write_login_profile(tmp_path, plain) is None
    assert write_login_profile(tmp_path, tmp_path / "missing") is None
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    assert write_login_profile(tmp_path, tmp_path / "binary") is None
    assert not (tmp_path / "login-profile").exists()
