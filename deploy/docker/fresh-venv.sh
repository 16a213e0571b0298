# Sourced by the install scripts: a fresh virtual environment, and a copy of the source tree
# to install from (not its venv, builds or git, so that the build leaves nothing behind).

new_venv() {  # VENV
    python3 -m venv "$1"
    "$1/bin/pip" install --no-cache-dir --quiet --upgrade pip
}

copy_of_tree() {  # SRC: prints the copy's folder (the caller removes it)
    copy=$(mktemp -d)
    tar -C "$1" --exclude=./.venv --exclude=./build --exclude=./.git -cf - . | tar -C "$copy" -xf -
    echo "$copy"
}
