#!/usr/bin/env bash
# The manual pages docs/man/uroce.1 and uroce.7:
#   - groff formats each without a warning;
#   - uroce.1 describes every subcommand and long option that `uroce --help` and
#     `uroce SUB --help` print (parsed from the help, not a list kept here);
#   - uroce.7 names every UROCE_* variable the sources read (string literals in provider/,
#     transport/ and tools/), and names no variable the sources do not read;
#   - `meson install --destdir` puts them under share/man/man1 and man7.
#
#   test_man.sh PATH_TO_UROCE SOURCE_ROOT BUILD_ROOT
# shellcheck shell=bash
set -u

if [[ $# -ne 3 ]]; then
    echo "usage: $0 PATH_TO_UROCE SOURCE_ROOT BUILD_ROOT" >&2
    exit 2
fi
SRC=$(readlink -f "$2")
BUILD=$(readlink -f "$3")
source "$(dirname "$0")/lib.sh"
lib_init "$1"

MAN1=$SRC/docs/man/uroce.1
MAN7=$SRC/docs/man/uroce.7

if ! command -v groff >/dev/null; then
    skip "manual pages: groff is not installed (Debian package groff-base)"
    finish
fi

# render PAGE: the page as plain ASCII text, on very long lines and without hyphenation,
# so that no option or variable name is split across lines.
render() {
    groff -t -man -Tascii -rLL=1000n -rHY=0 -P-cbou "$1" 2>/dev/null
}

# ------------------------------------------------------------- 1. formatting
for page in "$MAN1" "$MAN7"; do
    if [[ ! -f $page ]]; then
        not_ok "$(basename "$page") exists" "missing: $page"
        continue
    fi
    warnings=$(groff -t -man -ww -z -Tutf8 "$page" 2>&1)
    if [[ -z $warnings ]]; then
        ok "$(basename "$page"): groff -ww prints no warning"
    else
        not_ok "$(basename "$page"): groff -ww prints no warning" "$warnings"
    fi
    if command -v man >/dev/null; then
        warnings=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
        if [[ -z $warnings ]]; then
            ok "$(basename "$page"): man --warnings prints no warning"
        else
            not_ok "$(basename "$page"): man --warnings prints no warning" "$warnings"
        fi
    fi
done

# -------------------------------------------- 2. uroce.1 against uroce --help
TEXT1=$(render "$MAN1")
HELP=$("$UROCE" --help)
# CLI11 lists subcommands under "Subcommands:", one per line, up to a blank line.
mapfile -t SUBS < <(awk '/^Subcommands:/ {on = 1; next} on && /^$/ {exit} on {print $1}' <<<"$HELP")
if [[ ${#SUBS[@]} -lt 6 ]]; then
    not_ok "uroce --help lists the subcommands" "parsed: ${SUBS[*]:-nothing}" "$HELP"
fi
# The COMMANDS section of the rendered page: each subcommand starts an entry there.
COMMANDS=$(awk '/^COMMANDS/ {on = 1; next} on && /^[A-Z]/ {exit} on' <<<"$TEXT1")

# long_options HELP_TEXT: the long options of the "Options:" section, one per line.
long_options() {
    awk '/^Options:/ {on = 1; next} on && /^$/ {exit} on' <<<"$1" |
        grep -oE '(^|[ ,])--[a-z][a-z0-9-]*' | sed 's/^[ ,]//' | sort -u
}

# has_option TEXT OPTION: OPTION appears as a whole word.
has_option() {
    grep -Eq -- "(^|[^a-z0-9-])$2([^a-z0-9-]|\$)" <<<"$1"
}

missing=()
for opt in $(long_options "$HELP"); do
    has_option "$TEXT1" "$opt" || missing+=("uroce $opt")
done
for sub in "${SUBS[@]}"; do
    if ! grep -Eq "^ +$sub( |\$)" <<<"$COMMANDS"; then missing+=("command $sub"); fi
    sub_help=$("$UROCE" "$sub" --help)
    for opt in $(long_options "$sub_help"); do
        has_option "$TEXT1" "$opt" || missing+=("uroce $sub $opt")
    done
done
if [[ ${#missing[@]} -eq 0 ]]; then
    ok "uroce.1 describes every subcommand (${SUBS[*]}) and long option of the --help output"
else
    not_ok "uroce.1 describes every subcommand and long option of the --help output" \
        "missing from uroce.1: ${missing[*]}"
fi

# ------------------------------------------- 3. uroce.7 against the sources
# The variables the programs read: getenv() and setenv() take their names as string literals.
mapfile -t SRC_VARS < <(grep -rhoE --include='*.c' --include='*.cpp' --include='*.h' \
    '"UROCE_[A-Z0-9_]+"' "$SRC/provider" "$SRC/transport" "$SRC/tools" | tr -d '"' | sort -u)
if [[ ${#SRC_VARS[@]} -lt 5 ]]; then
    not_ok "the sources read UROCE_* variables" "found: ${SRC_VARS[*]:-none} under $SRC"
fi
TEXT7=$(render "$MAN7")
mapfile -t PAGE7_VARS < <(grep -oE 'UROCE_[A-Z0-9_]+' <<<"$TEXT7" | sort -u)
mapfile -t PAGE1_VARS < <(grep -oE 'UROCE_[A-Z0-9_]+' <<<"$TEXT1" | sort -u)
undocumented=$(comm -23 <(printf '%s\n' "${SRC_VARS[@]}") <(printf '%s\n' "${PAGE7_VARS[@]}"))
if [[ -z $undocumented ]]; then
    ok "uroce.7 names every UROCE_* variable the sources read (${SRC_VARS[*]})"
else
    not_ok "uroce.7 names every UROCE_* variable the sources read" "missing:" $undocumented
fi
unknown=$(comm -13 <(printf '%s\n' "${SRC_VARS[@]}") \
    <(printf '%s\n' "${PAGE7_VARS[@]}" "${PAGE1_VARS[@]}" | sort -u))
if [[ -z $unknown ]]; then
    ok "every UROCE_* variable the pages name is read by the sources"
else
    not_ok "every UROCE_* variable the pages name is read by the sources" \
        "not in provider/, transport/ or tools/:" $unknown
fi

# ------------------------------------------------------- 4. meson install
DEST=$WORK/dest
if out=$(timeout 120 meson install -C "$BUILD" --no-rebuild --tags man --destdir "$DEST" 2>&1); then
    for sect in 1 7; do
        found=$(find "$DEST" -path "*/share/man/man$sect/uroce.$sect*" -type f | head -n 1)
        if [[ -n $found ]] && cmp -s "$found" "$SRC/docs/man/uroce.$sect"; then
            ok "meson install puts uroce.$sect under share/man/man$sect (${found#"$DEST"})"
        else
            not_ok "meson install puts uroce.$sect under share/man/man$sect" \
                "installed: $(cd "$DEST" && find . -type f | head -n 20 | tr '\n' ' ')"
        fi
    done
else
    not_ok "meson install --tags man --destdir runs" "$out"
fi

finish
