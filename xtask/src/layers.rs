//! `cargo xtask check-layers`: the sans-I/O rule of ARCHITECTURE.md, enforced rather than only
//! kept. The core (`wire/`, `transport/`, `cc/`, `ibcm/`, `time.rs`, `stats.rs` and `stats/` under
//! roce-user/src) takes time, frames and work as arguments; it must not read a clock, open a
//! socket or a file, start a thread, take a lock, use an I/O crate (tokio, aya, libc, nix, ...)
//! or reach up into the layers built on it (`crate::xsk`, `engine`, `api`, `loader`, `cli`,
//! ...). Test code (`#[cfg(test)]` items and the files of `#[cfg(test)] mod x;`) may.
//!
//! The check reads the sources as tokens (comments, strings and character literals dropped),
//! expands `use` trees into full paths and matches every path against [`RULES`], so
//! `use std::{sync::Mutex, time::Instant}` is caught as well as `std::thread::spawn(..)` in an
//! expression. It reports each hit as `file:line`.
//!
//! The same command keeps the `unsafe` rule (README, "Layout"): outside `roce-ebpf`, the keyword
//! `unsafe` may stand only in [`UNSAFE_HOMES`]: the AF_XDP rings and UMEM (`xsk/`), the one
//! module that touches registered memory (`transport/mem.rs`), the `aya::Pod` impls of the map
//! types shared with the eBPF programs, and the FFI layers of the drop-in libraries.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

/// The sans-I/O core, relative to the workspace root: folders (every `.rs` below) and files.
pub(crate) const CORE: &[&str] = &[
    "roce-user/src/wire",
    "roce-user/src/transport",
    "roce-user/src/cc",
    "roce-user/src/ibcm",
    "roce-user/src/time.rs",
    "roce-user/src/stats.rs",
    "roce-user/src/stats",
];

/// The only places outside `roce-ebpf` where `unsafe` may be written (files, or folders with
/// everything below them), relative to the workspace root.
pub(crate) const UNSAFE_HOMES: &[&str] = &[
    "roce-user/src/xsk",
    "roce-user/src/transport/mem.rs",
    "roce-common/src/maps.rs",
    "roce-common/src/impair.rs",
    "roce-user/verbs/src/ffi",
    "roce-user/verbs/mlx5/src",
    "roce-user/verbs/efa/src",
];

/// Where `unsafe` is looked for: every `.rs` file below these (build output excluded).
const UNSAFE_SCAN: &[&str] = &["roce-user", "roce-common", "tests", "xtask"];

/// How a rule matches a path (its segments, a leading `::` dropped).
enum Match {
    /// The path starts with these segments (`std::thread` matches `std::thread::spawn`).
    Prefix(&'static [&'static str]),
    /// These segments stand next to each other anywhere in the path, a single identifier
    /// included: catches a name however it was imported (`Mutex`, `Instant::now`).
    Anywhere(&'static [&'static str]),
}

use Match::{Anywhere, Prefix};

const CLOCK: &str = "a clock (time is an argument of the core: crate::time::Instant)";
const THREAD: &str = "a thread";
const SOCKET: &str = "a socket";
const FS: &str = "the file system";
const LOCK: &str = "a lock (the caller serialises access to the core)";
const IO_CRATE: &str = "an I/O crate";
const UPPER: &str = "an upper layer (the import graph runs api -> engine -> transport -> wire)";

/// What the core must not use, and why.
const RULES: &[(Match, &str)] = &[
    (Prefix(&["std", "time", "Instant"]), CLOCK),
    (Prefix(&["std", "time", "SystemTime"]), CLOCK),
    (Prefix(&["std", "time", "UNIX_EPOCH"]), CLOCK),
    (Anywhere(&["SystemTime"]), CLOCK),
    (Anywhere(&["Instant", "now"]), CLOCK),
    (Prefix(&["std", "thread"]), THREAD),
    (Prefix(&["std", "net", "UdpSocket"]), SOCKET),
    (Prefix(&["std", "net", "TcpStream"]), SOCKET),
    (Prefix(&["std", "net", "TcpListener"]), SOCKET),
    (Prefix(&["std", "os", "unix", "net"]), SOCKET),
    (Anywhere(&["UdpSocket"]), SOCKET),
    (Anywhere(&["TcpStream"]), SOCKET),
    (Anywhere(&["TcpListener"]), SOCKET),
    (Prefix(&["std", "fs"]), FS),
    (Prefix(&["std", "sync", "Mutex"]), LOCK),
    (Prefix(&["std", "sync", "RwLock"]), LOCK),
    (Prefix(&["std", "sync", "Condvar"]), LOCK),
    (Anywhere(&["Mutex"]), LOCK),
    (Anywhere(&["RwLock"]), LOCK),
    (Prefix(&["tokio"]), IO_CRATE),
    (Prefix(&["aya"]), IO_CRATE),
    (Prefix(&["libc"]), IO_CRATE),
    (Prefix(&["nix"]), IO_CRATE),
    (Prefix(&["mio"]), IO_CRATE),
    (Prefix(&["socket2"]), IO_CRATE),
    (Prefix(&["parking_lot"]), LOCK),
    (Prefix(&["crate", "xsk"]), UPPER),
    (Prefix(&["crate", "engine"]), UPPER),
    (Prefix(&["crate", "api"]), UPPER),
    (Prefix(&["crate", "loader"]), UPPER),
    (Prefix(&["crate", "impair"]), UPPER),
    (Prefix(&["crate", "cli"]), UPPER),
    (Prefix(&["crate", "cm"]), UPPER),
    (Prefix(&["crate", "netns"]), UPPER),
    (Prefix(&["crate", "netinfo"]), UPPER),
];

/// One use of something forbidden.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The file, relative to the workspace root.
    pub(crate) file: String,
    /// 1-based line of the path's first segment.
    pub(crate) line: usize,
    /// The path as written (use trees expanded).
    pub(crate) path: String,
    /// Which rule it breaks.
    pub(crate) why: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}` is {}",
            self.file, self.line, self.path, self.why
        )
    }
}

/// Runs the check over the core of the workspace at `root` and fails naming every hit.
///
/// # Errors
/// A core file cannot be read, or the core uses something it must not.
pub(crate) fn check(root: &Path) -> anyhow::Result<()> {
    let stray = unsafe_outside_homes(root)?;
    for v in &stray {
        eprintln!("{v}");
    }
    if !stray.is_empty() {
        bail!(
            "check-layers: `unsafe` in {} place(s) outside {} (listed above); keep raw memory \
             access in one of those modules behind a safe API",
            stray.len(),
            UNSAFE_HOMES.join(", ")
        );
    }
    eprintln!(
        "xtask: check-layers: `unsafe` stands only in {} (and roce-ebpf)",
        UNSAFE_HOMES.join(", ")
    );
    let found = check_tree(root)?;
    if found.is_empty() {
        eprintln!(
            "xtask: check-layers: the sans-I/O core ({}) is clean",
            CORE.join(", ")
        );
        return Ok(());
    }
    for v in &found {
        eprintln!("{v}");
    }
    bail!(
        "check-layers: {} use(s) of I/O, clocks, threads, locks or upper layers in the sans-I/O \
         core (listed above); move them to an I/O edge (xsk/, engine, loader/) or into \
         #[cfg(test)] code",
        found.len()
    )
}

/// Every violation in the core of the workspace at `root`, in file and line order.
///
/// # Errors
/// A core file or folder cannot be read.
pub(crate) fn check_tree(root: &Path) -> anyhow::Result<Vec<Violation>> {
    let mut files = Vec::new();
    for entry in CORE {
        let path = root.join(entry);
        if path.is_dir() {
            collect_rs(&path, &mut files)?;
        } else if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    let mut test_files = Vec::new();
    let mut found = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        let label = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let scan = scan(&label, &text);
        for name in scan.test_mods {
            test_files.extend(child_module_files(file, &name));
        }
        found.extend(scan.violations.into_iter().map(|v| (file.clone(), v)));
    }
    Ok(found
        .into_iter()
        .filter(|(file, _)| !test_files.contains(file))
        .map(|(_, v)| v)
        .collect())
}

const UNSAFE_WHY: &str = "`unsafe` outside the modules allowed to hold it";

/// Every `unsafe` keyword (in code, not in comments or strings) in the files of
/// [`UNSAFE_SCAN`] that are not in [`UNSAFE_HOMES`], in file and line order.
///
/// # Errors
/// A folder or file cannot be read.
pub(crate) fn unsafe_outside_homes(root: &Path) -> anyhow::Result<Vec<Violation>> {
    let mut files = Vec::new();
    for dir in UNSAFE_SCAN {
        collect_rs(&root.join(dir), &mut files)?;
    }
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let label = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        if UNSAFE_HOMES
            .iter()
            .any(|h| label == *h || label.starts_with(&format!("{h}/")))
        {
            continue;
        }
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        found.extend(unsafe_in(&label, &text));
    }
    Ok(found)
}

/// The `unsafe` keywords of one file.
fn unsafe_in(file: &str, text: &str) -> Vec<Violation> {
    lex(text)
        .into_iter()
        .filter(|(_, t)| *t == Tok::Ident("unsafe".to_owned()))
        .map(|(line, _)| Violation {
            file: file.to_owned(),
            line,
            path: "unsafe".to_owned(),
            why: UNSAFE_WHY,
        })
        .collect()
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.file_name().is_some_and(|n| n == "target") {
            continue;
        }
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Where `mod name;` declared in `parent` lives: `name.rs` or `name/mod.rs`, next to a
/// `mod.rs`, or in a folder named after any other file.
fn child_module_files(parent: &Path, name: &str) -> [PathBuf; 2] {
    let dir = parent.parent().unwrap_or(Path::new("."));
    let stem = parent.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let base = if stem == "mod" || stem == "lib" || stem == "main" {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    [
        base.join(format!("{name}.rs")),
        base.join(name).join("mod.rs"),
    ]
}

/// Checks one source file; `file` names it in the report. Files of `#[cfg(test)] mod x;`
/// declarations are not followed (see [`check_tree`]).
#[cfg(test)]
fn check_source(file: &str, text: &str) -> Vec<Violation> {
    scan(file, text).violations
}

struct Scan {
    violations: Vec<Violation>,
    /// Names of `#[cfg(test)] mod name;` declarations (their files are test code).
    test_mods: Vec<String>,
}

fn scan(file: &str, text: &str) -> Scan {
    let tokens = lex(text);
    let (code, test_mods) = drop_test_items(&tokens);
    let mut violations = Vec::new();
    for (line, path) in paths(&code) {
        let segs: Vec<&str> = path.iter().map(String::as_str).collect();
        if let Some((_, why)) = RULES.iter().find(|(m, _)| matches(m, &segs)) {
            violations.push(Violation {
                file: file.to_owned(),
                line,
                path: segs.join("::"),
                why,
            });
        }
    }
    Scan {
        violations,
        test_mods,
    }
}

fn matches(m: &Match, segs: &[&str]) -> bool {
    let segs = segs.strip_prefix(&[""]).unwrap_or(segs);
    match m {
        Match::Prefix(p) => segs.starts_with(p),
        Match::Anywhere(p) => segs.windows(p.len()).any(|w| w == *p),
    }
}

/// A token of Rust source: only what the check needs.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A literal (number, string, char), already reduced to nothing.
    Lit,
}

/// Splits `text` into tokens with their 1-based line, dropping comments (doc comments
/// included), whitespace, lifetimes and the contents of literals.
fn lex(text: &str) -> Vec<(usize, Tok)> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            let start = line;
            i = skip_string(&c, i + 1, &mut line);
            out.push((start, Tok::Lit));
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char literal: past the escaped character, up to the closing quote.
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push((line, Tok::Lit));
            } else if at(i + 2) == '\'' {
                i += 3;
                out.push((line, Tok::Lit));
            } else {
                // A lifetime or label.
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_ascii_digit() {
            while i < c.len()
                && (c[i].is_alphanumeric()
                    || c[i] == '_'
                    || (c[i] == '.' && at(i + 1).is_ascii_digit()))
            {
                i += 1;
            }
            out.push((line, Tok::Lit));
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "b" | "c" | "r" | "br" | "cr");
            let mut hashes = i;
            while at(hashes) == '#' {
                hashes += 1;
            }
            let raw = word.ends_with('r') && at(hashes) == '"';
            if prefix && (at(i) == '"' || raw) {
                let start_line = line;
                i = if word.ends_with('r') {
                    skip_raw_string(&c, i, &mut line)
                } else {
                    skip_string(&c, i + 1, &mut line)
                };
                out.push((start_line, Tok::Lit));
            } else if word == "b" && at(i) == '\'' {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push((line, Tok::Lit));
            } else if word == "r" && at(i) == '#' {
                // A raw identifier `r#name`.
                i += 1;
            } else {
                out.push((line, Tok::Ident(word)));
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push((line, Tok::PathSep));
            i += 2;
        } else {
            out.push((line, Tok::Punct(ch)));
            i += 1;
        }
    }
    out
}

/// Skips a string body from just after its opening quote; returns the index after the close.
fn skip_string(c: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < c.len() && c[i] != '"' {
        if c[i] == '\\' {
            i += 1;
        }
        if c.get(i) == Some(&'\n') {
            *line += 1;
        }
        i += 1;
    }
    i + 1
}

/// Skips a raw string from its `#`s or opening quote; returns the index after the close.
fn skip_raw_string(c: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut hashes = 0;
    while c.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < c.len() {
        if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        *line += usize::from(c[i] == '\n');
        i += 1;
    }
    i
}

/// Whether an attribute starts at `i`: `#[cfg(test)]` (returns the index after it), or
/// `#![cfg(test)]` when `inner`.
fn cfg_test_at(t: &[(usize, Tok)], i: usize, inner: bool) -> Option<usize> {
    let mut want: Vec<Tok> = vec![Tok::Punct('#')];
    if inner {
        want.push(Tok::Punct('!'));
    }
    want.extend([
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ]);
    let got = t.get(i..i + want.len())?;
    got.iter()
        .map(|(_, tok)| tok)
        .eq(want.iter())
        .then_some(i + want.len())
}

/// Drops every item, statement, field or arm under `#[cfg(test)]` (and a whole file under
/// `#![cfg(test)]`); also returns the names of `#[cfg(test)] mod name;` declarations.
fn drop_test_items(t: &[(usize, Tok)]) -> (Vec<(usize, Tok)>, Vec<String>) {
    let mut out = Vec::new();
    let mut test_mods = Vec::new();
    if cfg_test_at(t, 0, true).is_some() {
        return (out, test_mods);
    }
    let mut i = 0;
    while i < t.len() {
        let Some(after) = cfg_test_at(t, i, false) else {
            out.push(t[i].clone());
            i += 1;
            continue;
        };
        let end = item_end(t, after);
        let item = &t[after..end];
        if let [
            ..,
            (_, Tok::Ident(m)),
            (_, Tok::Ident(name)),
            (_, Tok::Punct(';')),
        ] = item
            && m == "mod"
        {
            test_mods.push(name.clone());
        }
        i = end;
    }
    (out, test_mods)
}

/// The end (exclusive) of the item, statement, field or arm that starts at `i`: after a `;` or
/// `,` at its own depth (a `,` between generic arguments, as in `Result<(), E>`, does not
/// count), after the `}` that closes its body, or before a closer that belongs to the
/// enclosing block.
fn item_end(t: &[(usize, Tok)], mut i: usize) -> usize {
    let mut depth = 0usize;
    // `<`s open at depth 0 (generics of a signature, a type or a path), `->` and `=>` aside.
    let mut angles = 0usize;
    while i < t.len() {
        let arrow = i > 0 && matches!(t[i - 1].1, Tok::Punct('-' | '='));
        match t[i].1 {
            Tok::Punct('<') if depth == 0 => angles += 1,
            Tok::Punct('>') if depth == 0 && !arrow => angles = angles.saturating_sub(1),
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                if depth == 0 {
                    return i;
                }
                depth -= 1;
                let closes_body = depth == 0 && t[i].1 == Tok::Punct('}');
                // An attribute's `]` before the item does not end it.
                if closes_body {
                    return i + 1;
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct(',') if depth == 0 && angles == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Every path in the code with the line of its first segment: `use` trees expanded into one
/// path per leaf, and elsewhere each run `a::b::c` (a leading `::` kept as an empty segment).
fn paths(t: &[(usize, Tok)]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i].1 == Tok::Ident("use".into()) {
            let mut j = i + 1;
            use_tree(t, &mut j, &[], &mut out);
            i = j;
            continue;
        }
        let starts_run = matches!(t[i].1, Tok::Ident(_) | Tok::PathSep)
            && !(i > 0 && t[i - 1].1 == Tok::PathSep);
        if !starts_run {
            i += 1;
            continue;
        }
        let line = t[i].0;
        let mut segs = Vec::new();
        if t[i].1 == Tok::PathSep {
            segs.push(String::new());
            i += 1;
        }
        while let Some((_, Tok::Ident(name))) = t.get(i) {
            segs.push(name.clone());
            i += 1;
            if t.get(i).map(|x| &x.1) == Some(&Tok::PathSep) {
                i += 1;
            } else {
                break;
            }
        }
        if !segs.is_empty() {
            out.push((line, segs));
        }
    }
    out
}

/// Parses a use tree at `*i` under `prefix`, pushing one path per leaf; stops after the tree
/// (at a `,`, `}` or `;`, which it leaves for the caller except the final `;`).
fn use_tree(
    t: &[(usize, Tok)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(usize, Vec<String>)>,
) {
    let mut segs = prefix.to_vec();
    let line = t.get(*i).map_or(0, |x| x.0);
    if t.get(*i).map(|x| &x.1) == Some(&Tok::PathSep) {
        segs.push(String::new());
        *i += 1;
    }
    loop {
        match t.get(*i).map(|x| &x.1) {
            Some(Tok::Ident(name)) if name == "as" => {
                // `as alias` (or `as _`): the alias is not part of the path.
                *i += 2;
            }
            Some(Tok::Ident(name)) => {
                if name != "self" {
                    segs.push(name.clone());
                }
                *i += 1;
            }
            Some(Tok::PathSep) => *i += 1,
            Some(Tok::Punct('*')) => *i += 1,
            Some(Tok::Punct('{')) => {
                *i += 1;
                while !matches!(t.get(*i).map(|x| &x.1), None | Some(Tok::Punct('}'))) {
                    use_tree(t, i, &segs, out);
                    if t.get(*i).map(|x| &x.1) == Some(&Tok::Punct(',')) {
                        *i += 1;
                    }
                }
                *i += 1;
                if t.get(*i).map(|x| &x.1) == Some(&Tok::Punct(';')) {
                    *i += 1;
                }
                return;
            }
            Some(Tok::Punct(';')) => {
                *i += 1;
                out.push((line, segs));
                return;
            }
            _ => {
                out.push((line, segs));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_is_found_in_code_and_not_in_comments_or_strings() {
        let text = "//! no `unsafe` here\nfn f() {\n    let s = \"unsafe\";\n    unsafe { g() }\n}\n/* unsafe */ unsafe impl Send for X {}\n";
        let lines: Vec<usize> = unsafe_in("x.rs", text).iter().map(|v| v.line).collect();
        assert_eq!(lines, [4, 6]);
    }

    /// The workspace as it stands keeps the rule.
    #[test]
    fn the_workspace_keeps_unsafe_in_its_homes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let found = unsafe_outside_homes(&root).unwrap();
        assert!(found.is_empty(), "{found:?}");
        // The homes exist (a renamed module would otherwise silently widen nothing).
        for h in UNSAFE_HOMES {
            assert!(root.join(h).exists(), "{h}");
        }
    }

    /// A file that breaks the rule in every way the check knows, some of them hidden in use
    /// groups, aliases and expressions.
    const VIOLATES: &str = r#"//! Core module.
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex as Lock},
    time::{Duration, Instant},
};
use crate::engine::Engine;
use ::tokio::net::UdpSocket as _;

pub fn f() -> u64 {
    let s = "std::fs::read in a string is fine";
    std::thread::spawn(|| ());
    let _ = std::fs::read("/etc/hostname");
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC);
    0
}
"#;

    /// A file that keeps the rule: the forbidden names stand only in comments, strings,
    /// test code and the crate's own `time::Instant`.
    const CLEAN: &str = r##"//! Uses `std::time::Instant`? No: see crate::time.
/* a block comment naming tokio::spawn /* nested: aya::Ebpf */ */
use core::fmt;
use std::{collections::VecDeque, net::Ipv4Addr, time::Duration};

use crate::{time::Instant, wire::Bth};

/// Not `std::sync::Mutex`.
pub fn f(now: Instant, c: char, l: &'static str) -> Duration {
    let _ = (r#"std::thread::spawn"#, b"nix", '"', '\'', c, l);
    let _: Option<Ipv4Addr> = None;
    now.since(now)
}

#[cfg(test)]
use std::sync::Mutex;

#[cfg(test)]
fn helper(m: &std::sync::Mutex<u8>) -> Result<(), std::io::Error> {
    let _ = std::fs::read("/etc/hostname")?;
    Ok(())
}

pub struct S {
    #[cfg(test)]
    lock: std::collections::HashMap<u32, std::sync::Mutex<u8>>,
    n: u32,
}

#[cfg(test)]
mod tests {
    use std::{thread, time::Instant};
    #[test]
    fn t() {
        let _ = tokio::runtime::Builder::new_current_thread();
        thread::spawn(|| Instant::now());
    }
}

#[cfg(test)]
mod more_tests;
"##;

    #[test]
    fn a_violating_file_is_reported_by_line() {
        let got: Vec<(usize, String)> = check_source("core.rs", VIOLATES)
            .into_iter()
            .map(|v| (v.line, v.path))
            .collect();
        let want = [
            (4, "std::sync::Mutex"),
            (5, "std::time::Instant"),
            (7, "crate::engine::Engine"),
            (8, "::tokio::net::UdpSocket"),
            (12, "std::thread::spawn"),
            (13, "std::fs::read"),
            (14, "nix::time::clock_gettime"),
            (14, "nix::time::ClockId::CLOCK_MONOTONIC"),
        ];
        let want: Vec<(usize, String)> = want.iter().map(|&(l, p)| (l, p.to_owned())).collect();
        assert_eq!(got, want);
        let first = &check_source("core.rs", VIOLATES)[0];
        assert_eq!(
            first.to_string(),
            format!("core.rs:4: `std::sync::Mutex` is {LOCK}")
        );
    }

    #[test]
    fn a_clean_file_passes_and_its_test_modules_are_named() {
        assert_eq!(check_source("core.rs", CLEAN), Vec::new());
        assert_eq!(scan("core.rs", CLEAN).test_mods, ["more_tests"]);
    }

    /// A test item ends where it ends: generic commas do not cut it short, and the code after
    /// it is checked again.
    #[test]
    fn code_after_a_test_item_is_checked() {
        let text = "#[cfg(test)]\nfn h() -> Result<(), E> { std::fs::read(\"x\"); }\n\
                    fn g() { std::thread::yield_now(); }\n";
        let got: Vec<(usize, String)> = check_source("core.rs", text)
            .into_iter()
            .map(|v| (v.line, v.path))
            .collect();
        assert_eq!(got, [(3, "std::thread::yield_now".to_owned())]);
    }

    #[test]
    fn a_test_only_file_is_skipped() {
        let text = "#![cfg(test)]\nuse std::thread;\n";
        assert_eq!(check_source("core.rs", text), Vec::new());
    }

    /// Today's tree keeps the rule (so `cargo test -p xtask` guards it too).
    #[test]
    fn the_core_of_this_workspace_is_clean() {
        let found = check_tree(&crate::root()).expect("read the core");
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert!(shown.is_empty(), "{shown:#?}");
        let files = CORE
            .iter()
            .filter(|p| crate::root().join(p).exists())
            .count();
        assert_eq!(files, CORE.len(), "a core path moved: update CORE");
    }
}
