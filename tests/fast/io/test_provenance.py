"""Code provenance: the git commit of a checkout, its uncommitted changes and their hash, versions."""

import subprocess

from istar.io.provenance import code_provenance, git_provenance, package_sha256, package_versions


def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_commit_dirty_flag_and_diff_hash(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "code.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("results/\n")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()

    (root / "results").mkdir()
    (root / "results" / "out.json").write_text("{}")  # ignored outputs are not changes of the code
    clean = git_provenance(root / "results")
    assert clean == {"commit": head, "dirty": False, "diff_sha256": None, "root": str(root)}

    (root / "code.py").write_text("x = 2\n")
    edited = git_provenance(root)
    assert edited["commit"] == head and edited["dirty"] is True and len(edited["diff_sha256"]) == 64
    assert git_provenance(root) == edited  # the same changes, the same hash
    (root / "code.py").write_text("x = 3\n")
    assert git_provenance(root)["diff_sha256"] != edited["diff_sha256"]

    (root / "code.py").write_text("x = 1\n")
    (root / "new.py").write_text("y = 1\n")  # an untracked file is an uncommitted change too
    untracked = git_provenance(root)
    assert untracked["dirty"] is True and untracked["diff_sha256"] not in (None, edited["diff_sha256"])


def test_outside_a_checkout_it_says_so(tmp_path):
    found = git_provenance(tmp_path)
    assert found["commit"] is None and found["note"].startswith(f"not a git checkout: {tmp_path}")


def test_the_code_provenance_of_this_checkout():
    found = code_provenance()
    assert len(found["git"]["commit"]) == 40 and isinstance(found["git"]["dirty"], bool)
    versions = package_versions()
    assert found["versions"] == versions and versions["torch"] and versions["istar"] and versions["python"]


def test_the_code_hash_covers_the_packages_files_and_nothing_beside_them(tmp_path):
    package = tmp_path / "istar"
    (package / "report").mkdir(parents=True)
    (package / "report" / "claims.py").write_text("VERDICT = 1\n")
    first = package_sha256(package)
    (package / "report" / "__pycache__").mkdir()
    (package / "report" / "__pycache__" / "claims.cpython-311.pyc").write_bytes(b"compiled")
    (tmp_path / "growing.log").write_text("a log beside the package")
    assert package_sha256(package) == first  # bytecode and files outside the package leave it
    (package / "report" / "claims.py").write_text("VERDICT = 2\n")
    assert package_sha256(package) != first
    assert code_provenance()["code_sha256"] == package_sha256()  # the imported package's
