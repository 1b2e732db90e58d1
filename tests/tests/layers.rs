//! gpreempt-user's folders import one way only, and no files of gpreempt-user or gpreempt-sim
//! import each other round a cycle (docs/architecture.md, "Layers"). The folder-level import graph
//! of the non-test code is computed from the source: every `crate::x` path (and every item of a
//! `crate::{...}` group) in a file under `src/x/` or `src/x.rs` is an edge from its top folder to
//! `x`. The file-level graph (`files`) resolves each path to the file that defines the item. Test
//! code is left out: files named `tests.rs` / `*_tests.rs`, modules declared under
//! `#[cfg(test)]`, and `#[cfg(test)] mod name { ... }` blocks. Comments (and so doc links) and
//! the contents of literals are left out too.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

#[path = "layers/files.rs"]
mod files;

/// The layers, bottom first. A folder may import only from layers below its own.
const LAYERS: &[&[&str]] = &[
    &["clock", "lever", "outcome", "rundir", "term"],
    &["observe"],
    &["doctor", "policy"],
    &["backend"],
    &["controller"],
    &["tui", "trace"],
    &["cmd"],
    &["cli"],
];

/// The crate roots: not part of any layer.
const ROOTS: &[&str] = &["lib", "main"];

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpreempt-user/src")
}

/// `s` without comments (`//`, nested `/* */`; so doc links too) and with the contents of string
/// and character literals blanked, so neither can hold a path or a brace.
fn strip_comments(s: &str) -> String {
    let cs: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let at = |i: usize, t: &str| {
        t.chars()
            .enumerate()
            .all(|(k, c)| cs.get(i + k) == Some(&c))
    };
    while i < cs.len() {
        let c = cs[i];
        let prev_ident = i > 0 && (cs[i - 1].is_alphanumeric() || cs[i - 1] == '_');
        if at(i, "//") {
            while i < cs.len() && cs[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let mut depth = 0;
            while i < cs.len() {
                if at(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if at(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if cs[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if !prev_ident && (at(i, "r\"") || at(i, "r#") || at(i, "br\"") || at(i, "br#")) {
            // A raw string: `r#"..."#` (or `r#ident`, a raw identifier, kept).
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            let hashes = cs[i..].iter().take_while(|c| **c == '#').count();
            if cs.get(i + hashes) != Some(&'"') {
                out.extend(&cs[start..i]);
                continue;
            }
            i += hashes + 1;
            let close: String = std::iter::once('"')
                .chain((0..hashes).map(|_| '#'))
                .collect();
            while i < cs.len() && !at(i, &close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < cs.len() && cs[i] != '"' {
                i += if cs[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (cs.get(i + 1) == Some(&'\\') || cs.get(i + 2) == Some(&'\'')) {
            // A character literal (`'a` alone is a lifetime).
            i += 1;
            while i < cs.len() && cs[i] != '\'' {
                i += if cs[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The index of the `}` that closes the `{` at `open`.
fn closing(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `s` without `#[cfg(test)] mod name { ... }` blocks; and the names (with any `#[path]`) of
/// modules declared `#[cfg(test)] mod name;` (files of test code).
fn strip_test_modules(s: &str) -> (String, Vec<(String, Option<String>)>) {
    let mut out = String::new();
    let mut test_files = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        // Other attributes (e.g. `#[path = "x.rs"]`) may come between.
        let mut item = after.trim_start();
        let mut path = None;
        while item.starts_with("#[") {
            let end = item.find(']').map_or(item.len(), |e| e + 1);
            let attr = &item[..end];
            if let Some(p) = attr.strip_prefix("#[path = \"") {
                path = p.split('"').next().map(str::to_owned);
            }
            item = item[end..].trim_start();
        }
        let decl = item
            .strip_prefix("pub(crate) ")
            .or_else(|| item.strip_prefix("pub "))
            .unwrap_or(item);
        let Some(m) = decl.strip_prefix("mod ") else {
            // A test-only item other than a module: leave it out up to its end.
            let end = item
                .find(['{', ';'])
                .map(|e| {
                    if item.as_bytes()[e] == b'{' {
                        closing(item, e).map_or(item.len(), |c| c + 1)
                    } else {
                        e + 1
                    }
                })
                .unwrap_or(item.len());
            rest = &item[end..];
            continue;
        };
        let name: String = m
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after_name = m[name.len()..].trim_start();
        if let Some(after_decl) = after_name.strip_prefix(';') {
            test_files.push((name, path));
            rest = after_decl;
        } else {
            let open = item.find('{').unwrap_or(0);
            let end = closing(item, open).map_or(item.len(), |c| c + 1);
            rest = &item[end..];
        }
    }
    out.push_str(rest);
    (out, test_files)
}

/// The top-level modules a piece of non-test source names through `crate::`.
fn crate_imports(s: &str) -> BTreeSet<String> {
    let ident = |t: &str| -> String {
        t.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = s;
    while let Some(i) = rest.find("crate::") {
        let preceded = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        let after = &rest[i + "crate::".len()..];
        if preceded {
            // `gpreempt_user_crate::` and the like.
        } else if let Some(group) = after.strip_prefix('{') {
            let end = closing(after, 0).unwrap_or(after.len());
            let mut depth = 0;
            let mut start = 0;
            let body = &group[..end.saturating_sub(1)];
            for (j, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(body[start..j].trim_start()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            out.insert(ident(body[start..].trim_start()));
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    out.remove("");
    out.remove("self");
    out
}

/// The top folder (or root file) of `file` under `root`.
fn top(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Where `mod name;` declared in `file` lives (with `#[path]`, relative to the file's folder).
fn module_files(file: &Path, name: &str, path: Option<&str>) -> Vec<PathBuf> {
    let dir = file.parent().expect("a folder");
    if let Some(p) = path {
        return vec![dir.join(p)];
    }
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let base = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    vec![base.join(format!("{name}.rs")), base.join(name)]
}

/// The non-test files under `root` with their code (comments, literals and test blocks gone).
fn non_test_sources(root: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut test_paths: Vec<PathBuf> = Vec::new();
    let mut sources = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let (code, tests) = strip_test_modules(&strip_comments(&text));
        for (name, path) in tests {
            test_paths.extend(module_files(f, &name, path.as_deref()));
        }
        sources.push((f.clone(), code));
    }
    sources.retain(|(f, _)| {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        !(name == "tests.rs"
            || name.ends_with("_tests.rs")
            || test_paths.iter().any(|t| f.starts_with(t)))
    });
    sources
}

/// The folder-level import graph of the non-test code under `root`: from -> to -> files.
fn graph(root: &Path) -> Graph {
    let mut g = Graph::new();
    for (f, code) in non_test_sources(root) {
        let from = top(root, &f);
        let rel = f
            .strip_prefix(root)
            .unwrap_or(&f)
            .to_string_lossy()
            .into_owned();
        for to in crate_imports(&code) {
            if to != from {
                g.entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(rel.clone());
            }
        }
    }
    g
}

/// A cycle of `g`, if it has one: the folders in order, the first repeated at the end.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        n: &str,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in g.get(n).map(|e| e.keys()).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(g, m, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(g, n, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every edge that does not point to a lower layer, and every folder in no layer.
fn violations(g: &Graph, layers: &[&[&str]]) -> Vec<String> {
    let layer = |n: &str| layers.iter().position(|l| l.contains(&n));
    let mut out = Vec::new();
    for (from, tos) in g {
        for (to, files) in tos {
            match (layer(from), layer(to)) {
                (Some(a), Some(b)) if b < a => {}
                (Some(_), Some(_)) => out.push(format!(
                    "{from} -> {to} points up or sideways (in {})",
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                _ => out.push(format!("{from} -> {to}: a folder in no layer")),
            }
        }
    }
    out
}

fn describe(g: &Graph, cycle: &[String]) -> String {
    cycle
        .windows(2)
        .map(|w| {
            let files = g
                .get(&w[0])
                .and_then(|e| e.get(&w[1]))
                .map(|f| f.iter().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            format!("  {} -> {} ({files})", w[0], w[1])
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn gpreempt_user_folders_have_no_import_cycle() {
    let g = graph(&src());
    assert!(
        g.len() >= 8,
        "only {} folders import anything: {g:?}",
        g.len()
    );
    if let Some(c) = find_cycle(&g) {
        panic!("folder import cycle:\n{}", describe(&g, &c));
    }
}

#[test]
fn gpreempt_user_folders_import_only_down_the_documented_layers() {
    let g = graph(&src());
    let bad = violations(&g, LAYERS);
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
    // Every folder and root file under src/ has its place.
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .map(|f| top(&src(), f))
        .filter(|t| !t.ends_with("tests"))
        .collect();
    for t in tops {
        assert!(
            ROOTS.contains(&t.as_str()) || LAYERS.iter().any(|l| l.contains(&t.as_str())),
            "src/{t} is in no layer: place it in LAYERS and docs/architecture.md"
        );
    }
}

/// The layer list here is the one docs/architecture.md states.
#[test]
fn the_layers_are_the_documented_ones() {
    let doc = std::fs::read_to_string(src().join("../../docs/architecture.md"))
        .expect("docs/architecture.md");
    let stated: Vec<String> = LAYERS
        .iter()
        .map(|l| {
            l.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    let line = stated.join(" < ");
    assert!(
        doc.contains(&line),
        "docs/architecture.md does not state the layers as `{line}`"
    );
}

#[test]
fn the_checker_finds_a_cycle_and_an_upward_import_in_a_tiny_tree() {
    let dir = std::env::temp_dir().join(format!("layers-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |p: &str, s: &str| {
        let p = dir.join(p);
        std::fs::create_dir_all(p.parent().expect("a folder")).expect("mkdir");
        std::fs::write(p, s).expect("write");
    };
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\n#[cfg(test)]\nmod c_tests;\n",
    );
    write(
        "a/mod.rs",
        "// crate::c is only a comment\nuse crate::{b::x, clock};\n#[cfg(test)]\nmod t {\n    use crate::c;\n}\n",
    );
    write("b/mod.rs", "pub mod x;\n");
    write("b/x.rs", "pub fn f() { crate::a::g() }\n");
    write("c_tests.rs", "use crate::b;\n");
    write("clock.rs", "\n");
    let g = graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let edges: Vec<(String, String)> = g
        .iter()
        .flat_map(|(f, t)| t.keys().map(move |t| (f.clone(), t.clone())))
        .collect();
    assert_eq!(
        edges,
        [
            ("a".to_owned(), "b".to_owned()),
            ("a".to_owned(), "clock".to_owned()),
            ("b".to_owned(), "a".to_owned())
        ],
        "{g:?}"
    );
    let c = find_cycle(&g).expect("a -> b -> a is a cycle");
    assert_eq!(c.first(), c.last());
    assert!(
        c.contains(&"a".to_owned()) && c.contains(&"b".to_owned()),
        "{c:?}"
    );
    assert!(describe(&g, &c).contains("b/x.rs"));
    let bad = violations(&g, &[&["clock"], &["b"], &["a"]]);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].starts_with("b -> a points up"), "{bad:?}");
    // Without the upward edge there is no cycle.
    let mut ok = g.clone();
    ok.remove("b");
    assert_eq!(find_cycle(&ok), None);
    assert!(violations(&ok, &[&["clock"], &["b"], &["a"]]).is_empty());
}

fn sim_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpreempt-sim/src")
}

/// The file-level import graph of the crate under `root`, and its cycles, described.
fn file_cycles(root: &Path) -> (Graph, Vec<String>) {
    let g = files::file_graph(root);
    let found = files::cycles(&g)
        .iter()
        .map(|c| files::describe_chain(&g, c))
        .collect();
    (g, found)
}

#[test]
fn no_import_cycle_between_files() {
    let mut failures = Vec::new();
    for (name, root) in [("gpreempt-user", src()), ("gpreempt-sim", sim_src())] {
        let (g, found) = file_cycles(&root);
        assert!(
            g.len() >= 10,
            "{name}: only {} files import anything",
            g.len()
        );
        if !found.is_empty() {
            failures.push(format!(
                "{name}: file import cycles (each a chain of files, with the items used):\n{}",
                found.join("\n\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Writes `files` (path, text) under a fresh temp dir and returns its file graph's cycles.
fn tree_cycles(tag: &str, files: &[(&str, &str)]) -> (Graph, Vec<Vec<String>>) {
    let dir = std::env::temp_dir().join(format!("layers-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (p, s) in files {
        let p = dir.join(p);
        std::fs::create_dir_all(p.parent().expect("a folder")).expect("mkdir");
        std::fs::write(p, s).expect("write");
    }
    let g = files::file_graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let c = files::cycles(&g);
    (g, c)
}

#[test]
fn the_file_checker_finds_a_cycle_through_super() {
    let (g, c) = tree_cycles(
        "super",
        &[
            ("lib.rs", "pub mod a;\n"),
            ("a/mod.rs", "mod b;\nmod c;\npub use b::B;\n"),
            ("a/b.rs", "pub struct B;\npub fn f() { super::c::g() }\n"),
            (
                "a/c.rs",
                "use super::b::B;\npub fn g() -> Option<B> { None }\n",
            ),
        ],
    );
    assert_eq!(c, [vec!["a/b.rs", "a/c.rs", "a/b.rs"]], "{g:?}");
    let chain = files::describe_chain(&g, &c[0]);
    assert!(chain.contains("a/b.rs -> a/c.rs (g)"), "{chain}");
    assert!(chain.contains("a/c.rs -> a/b.rs (B)"), "{chain}");
}

#[test]
fn the_file_checker_follows_a_re_export_to_a_cycle() {
    // `y` names `Thing` through the facade `x`; the edge is to the file that defines it.
    let (g, c) = tree_cycles(
        "reexport",
        &[
            ("lib.rs", "pub mod x;\npub mod y;\n"),
            ("x/mod.rs", "mod inner;\npub use self::inner::Thing;\n"),
            ("x/inner.rs", "pub struct Thing(pub crate::y::Other);\n"),
            ("y.rs", "use crate::{x::{self, Thing}};\npub struct Other;\npub fn h(_: Thing, _: x::Thing) {}\n"),
        ],
    );
    assert_eq!(c, [vec!["x/inner.rs", "y.rs", "x/inner.rs"]], "{g:?}");
    assert!(
        !g.contains_key("x/mod.rs"),
        "a facade depends on nothing: {g:?}"
    );
}

#[test]
fn the_file_checker_passes_an_acyclic_tree() {
    let (g, c) = tree_cycles(
        "acyclic",
        &[
            ("lib.rs", "pub mod a;\n#[cfg(test)]\nmod lib_tests;\n"),
            // The parent declares and re-exports its children, and uses one below them both.
            (
                "a/mod.rs",
                "mod low;\nmod high;\npub use low::Low;\npub use high::*;\n\
                 pub fn top() -> Low { high::make() }\n\
                 #[cfg(test)]\nmod tests {\n    use super::high::make;\n}\n",
            ),
            // `super::Low` is the re-export: the edge goes to `low.rs`, not to the parent.
            (
                "a/high.rs",
                "use super::Low;\n/* super::top() */\npub fn make() -> Low { let _ = \"crate::a::top\"; Low }\n",
            ),
            ("a/low.rs", "// crate::a::high::make\npub struct Low;\n"),
            ("a/tests.rs", "use crate::a::top;\n"),
            ("lib_tests.rs", "use crate::a::top;\n"),
        ],
    );
    assert_eq!(c, Vec::<Vec<String>>::new(), "{g:?}");
    let edges: Vec<(&str, &str)> = g
        .iter()
        .flat_map(|(f, t)| t.keys().map(move |t| (f.as_str(), t.as_str())))
        .collect();
    assert_eq!(
        edges,
        [
            ("a/high.rs", "a/low.rs"),
            ("a/mod.rs", "a/high.rs"),
            ("a/mod.rs", "a/low.rs")
        ],
        "{g:?}"
    );
}

/// The middle: what decides and acts for every vendor. Nothing here may name one.
const MIDDLE: &[&str] = &["controller", "policy", "outcome.rs", "lever.rs"];

/// Words of identifiers that name a vendor, its driver or its objects.
const VENDOR_WORDS: &[&str] = &[
    "nv", "nvidia", "kfd", "amd", "amdgpu", "tsg", "gpfifo", "rm", "hsa", "hip", "cuda", "rocm",
];

/// The vendor words in the identifiers of `code` (comments and literals already removed):
/// identifiers split at `_` and at lower-to-upper case changes (`NvLever`: nv, lever).
fn vendor_names(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for ident in code.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        let mut words = Vec::new();
        for part in ident.split('_') {
            let mut w = String::new();
            let mut prev_lower = false;
            for c in part.chars() {
                if c.is_uppercase() && prev_lower {
                    words.push(std::mem::take(&mut w));
                }
                prev_lower = c.is_lowercase() || c.is_ascii_digit();
                w.extend(c.to_lowercase());
            }
            words.push(w);
        }
        if words.iter().any(|w| VENDOR_WORDS.contains(&w.as_str())) {
            out.insert(ident.to_owned());
        }
    }
    out
}

#[test]
fn the_vendor_name_check_finds_vendor_identifiers_only() {
    let code = strip_comments(
        "use crate::observe::model::Vendor;\n\
         // the NVIDIA backend\n\
         fn f(v: Vendor) -> bool { v == Vendor::Nvidia }\n\
         struct S { nv_levers: u8, levers: u8, tsg: u32 }\n\
         type L = NvLever; const K: u32 = KFD_STATUS_BITS;\n\
         const WIRE: &str = \"tsg\";\n",
    );
    let found: Vec<String> = vendor_names(&code).into_iter().collect();
    assert_eq!(
        found,
        ["KFD_STATUS_BITS", "NvLever", "Nvidia", "nv_levers", "tsg"],
        "comments, literals, `Vendor` and `levers` are not vendor names"
    );
}

#[test]
fn the_middle_names_no_vendor() {
    let root = src();
    let mut found = Vec::new();
    for (f, code) in non_test_sources(&root) {
        let rel = f
            .strip_prefix(&root)
            .unwrap_or(&f)
            .to_string_lossy()
            .into_owned();
        if !MIDDLE
            .iter()
            .any(|m| rel == *m || rel.starts_with(&format!("{m}/")))
        {
            continue;
        }
        for name in vendor_names(&code) {
            found.push(format!("{rel}: {name}"));
        }
    }
    assert!(
        found.is_empty(),
        "the policy, the controller and the outcome name no vendor (their backends do, \
         behind the seam in backend/: docs/architecture.md):\n{}",
        found.join("\n")
    );
}

/// No source file over this many lines (test files aside: docs/testing.md).
const MAX_LINES: usize = 800;

#[test]
fn no_source_file_is_over_800_lines() {
    let root = src().join("../..");
    let mut over = Vec::new();
    for krate in [
        "gpreempt-user/src",
        "gpreempt-sim/src",
        "gpreempt-common/src",
        "gpreempt-ebpf/src",
        "xtask/src",
        "tests/src",
    ] {
        let dir = root.join(krate);
        for (f, _) in non_test_sources(&dir) {
            let n = std::fs::read_to_string(&f)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
                .lines()
                .count();
            if n > MAX_LINES {
                let rel = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
                over.push(format!("{rel}: {n} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "split these by role (docs/architecture.md):\n{}",
        over.join("\n")
    );
}
