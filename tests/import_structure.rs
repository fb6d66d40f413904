//! The import structure of `src/` has no circle and no arrow running back
//! up (docs/architecture.md, "Source layout").
//!
//! Every file of the library and the binaries is a node; a file points at
//! another when it names a path into it (`use crate::…`, `super::…`,
//! `self::…`, a child module's name, or `vk_sandbox::…` in a binary).
//! Test-only code (`#[cfg(test)]` items and the modules declared under it)
//! is left out: tests may look at anything. Then, in every folder, the
//! arrows between its entries (files, and sub-folders taken whole) must
//! leave an order: no two entries depend on each other, directly or round
//! a circle. A child importing through its folder's `mod.rs` while that
//! `mod.rs` imports the child is such a circle (the arrow runs back up to
//! the facade), and so is a sub-folder pointing at a sibling that points
//! back. Cheap (a text scan, no build), so `make test` runs it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

thread_local! {
    /// Files and folders of test-only modules, relative to `src/`.
    static TEST_FILES: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
}

/// Module path (`["pods", "controller"]`) → file, relative to `src/`.
type Modules = BTreeMap<Vec<String>, PathBuf>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The source with comments, string and char literals blanked out.
fn strip_literals(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        // Raw strings: r"…", r#"…"#, br#"…"#.
        if (c == 'r' || (c == 'b' && next == Some('r'))) && (i == 0 || !is_ident(b[i - 1])) {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&'"') {
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == '\'' {
            // A char literal ('x', '\n', '\u{1F600}'), not a lifetime.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
                continue;
            }
            if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Open,
    Close,
    Star,
    Other(char),
}

fn tokens(text: &str) -> Vec<Tok> {
    let b: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if is_ident(c) {
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(b[start..i].iter().collect()));
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(Tok::Colons);
            i += 2;
        } else {
            out.push(match c {
                '{' => Tok::Open,
                '}' => Tok::Close,
                '*' => Tok::Star,
                other => Tok::Other(other),
            });
            i += 1;
        }
    }
    out
}

/// Removes every item under `#[cfg(test)]` (up to its `;` or its closing
/// brace) and returns the names of the test-only modules it declared.
fn strip_test_items(toks: Vec<Tok>) -> (Vec<Tok>, BTreeSet<String>) {
    let mut out = Vec::with_capacity(toks.len());
    let mut test_mods = BTreeSet::new();
    let mut i = 0;
    let is = |t: Option<&Tok>, want: &str| matches!(t, Some(Tok::Ident(s)) if s == want);
    while i < toks.len() {
        let cfg_test = toks.get(i) == Some(&Tok::Other('#'))
            && toks.get(i + 1) == Some(&Tok::Other('['))
            && is(toks.get(i + 2), "cfg")
            && toks.get(i + 3) == Some(&Tok::Other('('))
            && is(toks.get(i + 4), "test")
            && toks.get(i + 5) == Some(&Tok::Other(')'))
            && toks.get(i + 6) == Some(&Tok::Other(']'));
        if !cfg_test {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        let mut j = i + 7;
        let mut depth = 0;
        let mut last_ident = None;
        let mut saw_mod = false;
        while j < toks.len() {
            match &toks[j] {
                Tok::Ident(s) if depth == 0 => {
                    if saw_mod && last_ident.is_none() {
                        last_ident = Some(s.clone());
                    }
                    if s == "mod" {
                        saw_mod = true;
                    }
                }
                Tok::Open => depth += 1,
                Tok::Close => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                Tok::Other(';') if depth == 0 => {
                    if let (true, Some(name)) = (saw_mod, &last_ident) {
                        test_mods.insert(name.clone());
                    }
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        i = j;
    }
    (out, test_mods)
}

/// `mod name;` declarations (not inline modules), with or without `pub`.
fn child_modules(toks: &[Tok]) -> Vec<String> {
    let mut v = Vec::new();
    for w in toks.windows(3) {
        if let [Tok::Ident(m), Tok::Ident(name), Tok::Other(';')] = w
            && m == "mod"
        {
            v.push(name.clone());
        }
    }
    v
}

/// One parsed source file.
struct File {
    module: Vec<String>,
    toks: Vec<Tok>,
    children: Vec<String>,
    /// A crate root of a binary: `vk_sandbox::` is the library.
    binary: bool,
}

fn read(path: &Path) -> (Vec<Tok>, BTreeSet<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    strip_test_items(tokens(&strip_literals(&text)))
}

/// Every production module of the library, from `lib.rs` down, plus the
/// binaries (each a module of its own: `main`, `bin::<name>`).
fn load() -> (Modules, Vec<(PathBuf, File)>) {
    let root = src();
    let mut modules = Modules::new();
    let mut files = Vec::new();
    let mut queue = vec![(Vec::<String>::new(), PathBuf::from("lib.rs"))];
    while let Some((module, rel)) = queue.pop() {
        let (toks, test_mods) = read(&root.join(&rel));
        let children: Vec<String> = child_modules(&toks)
            .into_iter()
            .filter(|c| !test_mods.contains(c))
            .collect();
        // Where this file's child modules live.
        let dir = match rel.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs") | Some("mod.rs") => {
                rel.parent().map(Path::to_path_buf).unwrap_or_default()
            }
            _ => rel.with_extension(""),
        };
        for t in &test_mods {
            TEST_FILES.with(|f| {
                f.borrow_mut().push(dir.join(format!("{t}.rs")));
                f.borrow_mut().push(dir.join(t));
            });
        }
        for c in &children {
            let flat = dir.join(format!("{c}.rs"));
            let nested = dir.join(c).join("mod.rs");
            let file = if root.join(&flat).exists() {
                flat
            } else {
                nested
            };
            assert!(
                root.join(&file).exists(),
                "module {c} of {} has no file",
                rel.display()
            );
            let mut m = module.clone();
            m.push(c.clone());
            queue.push((m, file));
        }
        modules.insert(module.clone(), rel.clone());
        files.push((
            rel,
            File {
                module,
                toks,
                children,
                binary: false,
            },
        ));
    }
    let mut bins = vec![PathBuf::from("main.rs")];
    if let Ok(dir) = std::fs::read_dir(root.join("bin")) {
        for e in dir.flatten() {
            bins.push(PathBuf::from("bin").join(e.file_name()));
        }
    }
    for rel in bins {
        let (toks, _) = read(&root.join(&rel));
        let module = vec![format!("<{}>", rel.display())];
        modules.insert(module.clone(), rel.clone());
        files.push((
            rel,
            File {
                module,
                toks,
                children: Vec::new(),
                binary: true,
            },
        ));
    }
    (modules, files)
}

/// Every path the file names, expanded (`a::{b, c::d}` gives `a::b` and
/// `a::c::d`), each starting with `crate`, `super`, `self`, a child module
/// or, in a binary, `vk_sandbox`.
fn paths(file: &File) -> Vec<Vec<String>> {
    let toks = &file.toks;
    let starts_path = |s: &str| {
        matches!(s, "crate" | "super" | "self")
            || (file.binary && s == "vk_sandbox")
            || file.children.iter().any(|c| c == s)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let after_colons = i > 0 && toks[i - 1] == Tok::Colons;
        match &toks[i] {
            Tok::Ident(s)
                if !after_colons && starts_path(s) && toks.get(i + 1) == Some(&Tok::Colons) =>
            {
                i = tree(toks, i, Vec::new(), &mut out);
            }
            _ => i += 1,
        }
    }
    out
}

/// Parses a use tree from `toks[i]` under `prefix`; returns the index after it.
fn tree(toks: &[Tok], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                i += 1;
            }
            Some(Tok::Star) => {
                i += 1;
                break;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => {
                            i += 1;
                            break;
                        }
                        Some(Tok::Other(',')) => i += 1,
                        Some(Tok::Ident(s)) if s == "as" => i += 2,
                        None => break,
                        _ => i = tree(toks, i, prefix.clone(), out),
                    }
                }
                return i;
            }
            _ => break,
        }
        if toks.get(i) == Some(&Tok::Colons) {
            i += 1;
        } else {
            break;
        }
    }
    if !prefix.is_empty() {
        out.push(prefix);
    }
    i
}

/// The module a path leads into: its longest prefix that is a module.
fn resolve(file: &File, path: &[String], modules: &Modules) -> Option<Vec<String>> {
    let mut at: Vec<String> = if file.binary {
        Vec::new()
    } else {
        file.module.clone()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") | Some("vk_sandbox") => {
            at.clear();
            rest = &rest[1..];
        }
        _ => {
            while rest.first().map(String::as_str) == Some("self") {
                rest = &rest[1..];
            }
            while rest.first().map(String::as_str) == Some("super") {
                at.pop()?;
                rest = &rest[1..];
            }
        }
    }
    let mut best = modules.contains_key(&at).then(|| at.clone());
    for seg in rest {
        at.push(seg.clone());
        if modules.contains_key(&at) {
            best = Some(at.clone());
        } else {
            break;
        }
    }
    best
}

/// File → the files it points at.
fn edges() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let (modules, files) = load();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (rel, file) in &files {
        let to = edges.entry(rel.clone()).or_default();
        for p in paths(file) {
            if let Some(m) = resolve(file, &p, &modules) {
                let target = &modules[&m];
                if target != rel {
                    to.insert(target.clone());
                }
            }
        }
    }
    edges
}

/// The entry of `dir` that `file` lies in (a file name, or a sub-folder).
fn entry_in(dir: &Path, file: &Path) -> Option<String> {
    let rest = file.strip_prefix(dir).ok()?;
    rest.components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
}

/// Every circle among the entries of each folder, with the file arrows
/// that make it.
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<String> {
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for f in edges.keys() {
        let mut d = f.parent();
        while let Some(p) = d {
            dirs.insert(p.to_path_buf());
            d = p.parent();
        }
    }
    let mut found = Vec::new();
    for dir in dirs {
        // Entry → entry, with one file arrow as the witness.
        let mut graph: BTreeMap<String, BTreeMap<String, (PathBuf, PathBuf)>> = BTreeMap::new();
        for (from, tos) in edges {
            let Some(a) = entry_in(&dir, from) else {
                continue;
            };
            for to in tos {
                let Some(b) = entry_in(&dir, to) else {
                    continue;
                };
                if a != b {
                    graph
                        .entry(a.clone())
                        .or_default()
                        .entry(b)
                        .or_insert((from.clone(), to.clone()));
                }
            }
        }
        for cycle in find_cycles(&graph) {
            let arrows: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let (f, t) = &graph[&w[0]][&w[1]];
                    format!("{} → {}", f.display(), t.display())
                })
                .collect();
            found.push(format!(
                "in src/{}: {} ({})",
                dir.display(),
                cycle.join(" → "),
                arrows.join(", ")
            ));
        }
    }
    found
}

/// One circle per strongly connected group of more than one entry,
/// written as a closed walk (first entry repeated at the end).
fn find_cycles(graph: &BTreeMap<String, BTreeMap<String, (PathBuf, PathBuf)>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = graph
        .iter()
        .flat_map(|(a, tos)| std::iter::once(a).chain(tos.keys()))
        .collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for next in graph.get(&n).into_iter().flat_map(|t| t.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for n in nodes {
        if done.contains(n) || !reach(n).contains(n) {
            continue;
        }
        // Walk back to n along arrows that stay in its group (breadth first).
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([n.clone()]);
        let mut closed = None;
        while let Some(cur) = queue.pop_front() {
            for next in graph.get(&cur).into_iter().flat_map(|t| t.keys()) {
                if next == n {
                    closed = Some(cur.clone());
                    break;
                }
                if !prev.contains_key(next) && reach(next).contains(n) {
                    prev.insert(next.clone(), cur.clone());
                    queue.push_back(next.clone());
                }
            }
            if closed.is_some() {
                break;
            }
        }
        // n → … → last → n, rebuilt backwards from the arrow that closes it.
        let mut walk = Vec::new();
        let mut cur = closed.unwrap_or_else(|| n.clone());
        while &cur != n {
            walk.push(cur.clone());
            cur = prev[&cur].clone();
        }
        walk.push(n.clone());
        walk.reverse();
        walk.push(n.clone());
        for w in &walk {
            done.insert(w.clone());
        }
        for m in reach(n).into_iter().filter(|m| reach(m).contains(n)) {
            done.insert(m);
        }
        out.push(walk);
    }
    out
}

/// Every `.rs` file under `dir`, relative to `src/`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p.strip_prefix(src()).expect("under src").to_path_buf());
        }
    }
}

/// A file no module declares is not compiled, and would escape the check.
#[test]
fn every_file_of_src_is_a_module() {
    let (_, files) = load();
    let reached: BTreeSet<PathBuf> = files.into_iter().map(|(rel, _)| rel).collect();
    let tests = TEST_FILES.with(|f| f.borrow().clone());
    let mut all = Vec::new();
    rust_files(&src(), &mut all);
    let stray: Vec<String> = all
        .into_iter()
        .filter(|f| !reached.contains(f) && !tests.iter().any(|t| f.starts_with(t)))
        .map(|f| f.display().to_string())
        .collect();
    assert!(stray.is_empty(), "files no module declares: {stray:?}");
}

#[test]
fn src_has_no_circle_and_no_arrow_running_back_up() {
    let edges = edges();
    assert!(
        edges.len() > 50,
        "the scan found only {} files: is src/ where it should be?",
        edges.len()
    );
    let circles = circles(&edges);
    assert!(
        circles.is_empty(),
        "import circles (an entry of a folder that depends on one depending on it):\n  {}",
        circles.join("\n  ")
    );
}

/// The checker sees what it must: paths in use trees, `super`, child
/// modules, and test code left out.
#[test]
fn the_scan_reads_use_trees_and_skips_tests() {
    let file = File {
        module: vec!["a".into(), "b".into()],
        toks: strip_test_items(tokens(&strip_literals(
            "use crate::x::{y::{Z, W as V}, q};\nuse super::*;\nfn f() { kid::go(); other::no(); \
             let s = \"crate::fake::path\"; let c = '{'; }\n// crate::commented::out\n\
             #[cfg(test)]\nmod tests { use crate::only::in_tests; }\n#[cfg(test)]\nmod fixtures;\n",
        )))
        .0,
        children: vec!["kid".into()],
        binary: false,
    };
    let got: BTreeSet<String> = paths(&file).iter().map(|p| p.join("::")).collect();
    let want: BTreeSet<String> = [
        "crate::x::y::Z",
        "crate::x::y::W",
        "crate::x::q",
        "super",
        "kid::go",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
    let (_, test_mods) = strip_test_items(tokens("#[cfg(test)]\nmod fixtures;\nmod real;"));
    assert_eq!(test_mods, BTreeSet::from(["fixtures".to_string()]));
    let mut g: BTreeMap<String, BTreeMap<String, (PathBuf, PathBuf)>> = BTreeMap::new();
    let w = (PathBuf::new(), PathBuf::new());
    g.entry("a".into())
        .or_default()
        .insert("b".into(), w.clone());
    g.entry("b".into())
        .or_default()
        .insert("c".into(), w.clone());
    g.entry("c".into())
        .or_default()
        .insert("a".into(), w.clone());
    g.entry("c".into()).or_default().insert("d".into(), w);
    assert_eq!(find_cycles(&g), vec![vec!["a", "b", "c", "a"]]);
}
