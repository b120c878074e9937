#!/usr/bin/env bash
# Build the four Lambda functions for arm64 (provided.al2023) with cargo-lambda and the
# size/cold-start tuned `lambda` profile, and package them into dist/:
#
#   dist/<function>.zip      bootstrap at the zip root, mode 0755, fixed timestamps
#                            (byte-identical for identical binaries, so an unchanged
#                            function is not redeployed)
#   dist/SHA256SUMS          checksums of the zips
#   dist/sizes.tsv           function, binary bytes, zip bytes
#   dist/template.json       template.yaml with each function's CodeUri pointing at its
#                            zip and no build metadata: deployable without `sam build`
#                            (aws cloudformation package/deploy, or sam deploy)
#
# Usage: scripts/package.sh [function ...]       (default: all four)
#
# Environment:
#   SAS_PROFILE      cargo profile (default lambda: inherits release, fat LTO,
#                    codegen-units 1, strip, panic unwind -- see Cargo.toml)
#   SAS_TOOLS_VENV   venv root for cargo-lambda (default <repo>/.venv-tools); a
#                    cargo-lambda already on PATH is used if the venv has none
#   CARGO_TARGET_DIR cargo's target dir (default <repo>/target); the arm64 binaries go to
#                    $CARGO_TARGET_DIR/lambda-arm64/<function>/bootstrap so they never
#                    collide with native `cargo lambda build` output
#   DIST             output directory (default <repo>/dist)
#   PYTHON           interpreter for the venv (default python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ALL=(submission scheduler agent supervisor)
if [[ $# -gt 0 ]]; then FUNCTIONS=("$@"); else FUNCTIONS=("${ALL[@]}"); fi
PROFILE=${SAS_PROFILE:-lambda}
VENV_ROOT=${SAS_TOOLS_VENV:-$ROOT/.venv-tools}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
LAMBDA_DIR="$CARGO_TARGET_DIR/lambda-arm64"
DIST=${DIST:-$ROOT/dist}
PYTHON=${PYTHON:-python3}
TARGET=aarch64-unknown-linux-gnu
# cargo-lambda ships zig for the cross link; pinned for reproducible builds
# (scripts/cargo-lambda-venv.sh says how).

log() { printf '==> %s\n' "$*" >&2; }

for f in "${FUNCTIONS[@]}"; do
    [[ " ${ALL[*]} " == *" $f "* ]] || { log "unknown function '$f' (one of: ${ALL[*]})"; exit 2; }
done

# ---- tools ---------------------------------------------------------------------------
# scripts/cargo-lambda-venv.sh installs the pinned cargo-lambda (rebuilt only when the lock
# file changed) and prints its bin directory.
PATH="$(SAS_TOOLS_VENV="$VENV_ROOT" PYTHON="$PYTHON" "$ROOT/scripts/cargo-lambda-venv.sh"):$PATH"
export PATH
VENV="$VENV_ROOT/cargo-lambda"
command -v cargo-lambda >/dev/null || { log "cargo-lambda not found"; exit 2; }
if ! rustup target list --installed | grep -qx "$TARGET"; then
    log "rustup target add $TARGET"
    rustup target add "$TARGET"
fi

# ---- build ---------------------------------------------------------------------------
bins=()
for f in "${FUNCTIONS[@]}"; do bins+=(--bin "$f"); done
log "cargo lambda build --profile $PROFILE --arm64 ${bins[*]} (target dir ${CARGO_TARGET_DIR#"$ROOT"/})"
start=$(date +%s)
(cd "$ROOT" && cargo lambda build --profile "$PROFILE" --arm64 --lambda-dir "$LAMBDA_DIR" "${bins[@]}")
log "built in $(($(date +%s) - start)) s"
# A deployed function must never carry the simulation's planted bugs.
for f in "${FUNCTIONS[@]}"; do "$ROOT/scripts/check-no-mutations.sh" --binary "$LAMBDA_DIR/$f/bootstrap"; done

# ---- package -------------------------------------------------------------------------
mkdir -p "$DIST"
"$VENV/bin/python" - "$ROOT" "$LAMBDA_DIR" "$DIST" "${FUNCTIONS[@]}" <<'PY'
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile

import yaml

root, lambda_dir, dist, *functions = sys.argv[1:]

# --- zips: deterministic (fixed date, fixed mode, one entry)
rows = []
for fn in functions:
    binary = os.path.join(lambda_dir, fn, "bootstrap")
    data = open(binary, "rb").read()
    head = data[:20]
    if head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != 183:  # EM_AARCH64
        sys.exit(f"{binary} is not an aarch64 ELF binary")
    zpath = os.path.join(dist, f"{fn}.zip")
    info = zipfile.ZipInfo("bootstrap", date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = (stat.S_IFREG | 0o755) << 16
    info.create_system = 3  # unix, so the mode is honoured
    info.compress_type = zipfile.ZIP_DEFLATED
    tmp = zpath + ".tmp"
    with zipfile.ZipFile(tmp, "w") as z:
        z.writestr(info, data, compresslevel=9)
    os.replace(tmp, zpath)
    rows.append((fn, len(data), os.path.getsize(zpath)))

with open(os.path.join(dist, "sizes.tsv"), "w") as f:
    f.write("function\tbinary_bytes\tzip_bytes\n")
    for r in rows:
        f.write("%s\t%d\t%d\n" % r)
sums = []
for fn in sorted(os.listdir(dist)):
    if fn.endswith(".zip"):
        sums.append("%s  %s" % (hashlib.sha256(open(os.path.join(dist, fn), "rb").read()).hexdigest(), fn))
with open(os.path.join(dist, "SHA256SUMS"), "w") as f:
    f.write("\n".join(sums) + "\n")

# --- dist/template.json: CodeUri -> the zips, build metadata dropped.
class CfnLoader(yaml.SafeLoader):
    pass

def construct_tag(loader, suffix, node):
    name = "Ref" if suffix == "Ref" else "Fn::" + suffix
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}

CfnLoader.add_multi_constructor("!", construct_tag)
template = yaml.load(open(os.path.join(root, "template.yaml")), Loader=CfnLoader)
template.get("Globals", {}).get("Function", {}).pop("CodeUri", None)
missing = []
for name, res in template["Resources"].items():
    if res["Type"] != "AWS::Serverless::Function":
        continue
    binary = res.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
    zpath = os.path.join(dist, f"{binary}.zip")
    if not os.path.exists(zpath):
        missing.append(binary)
    res["Properties"]["CodeUri"] = f"{binary}.zip"
    res["Metadata"].pop("BuildMethod", None)
    res["Metadata"].pop("BuildProperties", None)
with open(os.path.join(dist, "template.json"), "w") as f:
    json.dump(template, f, indent=1)

print("%-11s %12s %12s" % ("function", "binary", "zip"), file=sys.stderr)
for fn, b, z in rows:
    print("%-11s %9.2f MB %9.2f MB" % (fn, b / 1e6, z / 1e6), file=sys.stderr)
if missing:
    print("note: dist/template.json also names %s.zip, not built in this run" % ", ".join(missing), file=sys.stderr)
PY
log "packages in ${DIST#"$ROOT"/}/ (template.json points at them)"
