//! The file-level import graph: which module file's items each non-test file uses.
//!
//! A path (`crate::a::b::C`, `super::C`, `self::b::C`, a `use` group, a name a `use` binds, a
//! child module's name) resolves to the deepest module file it names (`a/b.rs` or `a/b/mod.rs`),
//! then through that module's imports to the file that defines the item: a re-export is not a
//! dependency of the facade that makes it. Declaring `mod child;` and re-exporting a child's items
//! are structure, not edges; a private `use`, a path in code, and a re-exported or glob-imported
//! name the file's own code uses are edges.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::Path,
};

use super::{non_test_sources, Graph};

/// A token of stripped source: an identifier or keyword, or punctuation (`::` is one token).
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Id(String),
    P(&'static str),
}

fn is_id(t: Option<&Tok>, s: &str) -> bool {
    matches!(t, Some(Tok::Id(x)) if x == s)
}

fn is_p(t: Option<&Tok>, s: &str) -> bool {
    matches!(t, Some(Tok::P(x)) if *x == s)
}

/// The tokens of `s` (comments and literals already blanked): identifiers and the punctuation
/// the parser needs; numbers and other symbols become `?`.
fn tokens(s: &str) -> Vec<Tok> {
    let cs: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(Tok::Id(cs[start..i].iter().collect()));
            continue;
        }
        if c.is_ascii_digit() {
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(Tok::P("?"));
            continue;
        }
        i += 1;
        if c == ':' && cs.get(i) == Some(&':') {
            i += 1;
            out.push(Tok::P("::"));
            continue;
        }
        let p = match c {
            '{' => "{",
            '}' => "}",
            '(' => "(",
            ')' => ")",
            ',' => ",",
            ';' => ";",
            ':' => ":",
            '*' => "*",
            '.' => ".",
            '$' => "$",
            '!' => "!",
            c if c.is_whitespace() => continue,
            _ => "?",
        };
        out.push(Tok::P(p));
    }
    out
}

/// One leaf of a `use` tree: the path as written, the name it binds (none for a glob).
#[derive(Debug, Clone)]
struct Use {
    path: Vec<String>,
    name: Option<String>,
    public: bool,
}

/// The leaves of the use tree at `toks[*i..]` under `prefix`; `*i` ends past the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], public: bool, out: &mut Vec<Use>) {
    let mut path = prefix.to_vec();
    if is_p(toks.get(*i), "::") {
        // `::std::...`: an extern crate.
        path.push("::".to_owned());
        *i += 1;
    }
    loop {
        match toks.get(*i) {
            Some(Tok::P("{")) => {
                *i += 1;
                while !is_p(toks.get(*i), "}") && *i < toks.len() {
                    use_tree(toks, i, &path, public, out);
                    if is_p(toks.get(*i), ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::P("*")) => {
                *i += 1;
                out.push(Use {
                    path,
                    name: None,
                    public,
                });
                return;
            }
            Some(Tok::Id(s)) => {
                path.push(s.clone());
                *i += 1;
                if is_p(toks.get(*i), "::") {
                    *i += 1;
                    continue;
                }
                if path.last().is_some_and(|l| l == "self") {
                    path.pop();
                }
                let mut name = path.last().cloned();
                if is_id(toks.get(*i), "as") {
                    if let Some(Tok::Id(a)) = toks.get(*i + 1) {
                        name = Some(a.clone());
                    }
                    *i += 2;
                }
                out.push(Use { path, name, public });
                return;
            }
            _ => return,
        }
    }
}

/// What one non-test file holds, for resolving paths into it and out of it.
#[derive(Debug, Default)]
struct File {
    rel: String,
    /// Module path from the crate root (`a/b.rs` and `a/b/mod.rs` are `[a, b]`).
    module: Vec<String>,
    uses: Vec<Use>,
    /// Names the file's top level defines.
    defs: BTreeSet<String>,
    /// The tokens outside `use` items.
    code: Vec<Tok>,
}

const DEF_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod",
];

fn parse(rel: &str, module: Vec<String>, src: &str) -> File {
    let toks = tokens(src);
    let mut f = File {
        rel: rel.to_owned(),
        module,
        ..File::default()
    };
    let mut i = 0;
    let mut depth = 0usize;
    while i < toks.len() {
        if is_id(toks.get(i), "use") {
            // The visibility in front: `pub`, `pub(crate)`, `pub(super)`; `pub(self)` is private.
            let public = match i.checked_sub(1).and_then(|j| toks.get(j)) {
                Some(Tok::Id(p)) if p == "pub" => true,
                Some(Tok::P(")")) => !is_id(toks.get(i.saturating_sub(2)), "self"),
                _ => false,
            };
            // Drop the visibility tokens already copied into `code`.
            if public || is_p(toks.get(i.wrapping_sub(1)), ")") {
                while let Some(t) = f.code.pop() {
                    if t == Tok::Id("pub".to_owned()) {
                        break;
                    }
                }
            }
            i += 1;
            use_tree(&toks, &mut i, &[], public, &mut f.uses);
            while i < toks.len() && !is_p(toks.get(i), ";") {
                i += 1;
            }
            i += 1;
            continue;
        }
        // Items at the file's top level (associated items are reached through their type).
        if depth == 0 {
            match (toks.get(i), toks.get(i + 1), toks.get(i + 2)) {
                (Some(Tok::Id(k)), Some(Tok::Id(n)), _) if DEF_KEYWORDS.contains(&k.as_str()) => {
                    f.defs.insert(n.clone());
                }
                (Some(Tok::Id(k)), Some(Tok::P("!")), Some(Tok::Id(n))) if k == "macro_rules" => {
                    f.defs.insert(n.clone());
                }
                _ => {}
            }
        }
        if is_p(toks.get(i), "{") {
            depth += 1;
        } else if is_p(toks.get(i), "}") {
            depth = depth.saturating_sub(1);
        }
        f.code.push(toks[i].clone());
        i += 1;
    }
    f
}

/// The module path of `rel` (a path under the crate's `src/`), or None for a binary's root.
fn module_of(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    match stem {
        "lib" if parts.is_empty() => {}
        "main" if parts.is_empty() => return None,
        "mod" => {}
        s => parts.push(s.to_owned()),
    }
    Some(parts)
}

/// A crate's non-test files, by module path.
struct Crate {
    files: BTreeMap<Vec<String>, File>,
}

/// How deep re-exports and imports are followed (they cannot loop in a crate that compiles).
const DEPTH: usize = 16;

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while", "union",
];

impl Crate {
    fn load(root: &Path) -> Crate {
        let mut files = BTreeMap::new();
        for (path, code) in non_test_sources(root) {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            if let Some(module) = module_of(rel) {
                let f = parse(&rel.to_string_lossy(), module.clone(), &code);
                files.insert(module, f);
            }
        }
        Crate { files }
    }

    fn is_module(&self, m: &[String]) -> bool {
        self.files.contains_key(m)
    }

    /// The absolute path `path` (as written in module `m`) names, or None (an extern crate, a
    /// local item, `Self`).
    fn absolute(&self, m: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        let (head, rest) = path.split_first()?;
        let mut base: Vec<String> = match head.as_str() {
            "crate" => Vec::new(),
            "self" => m.to_vec(),
            "super" => {
                let mut b = m.to_vec();
                b.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    b.pop()?;
                    rest = &rest[1..];
                }
                b.extend(rest.iter().cloned());
                return Some(b);
            }
            name => {
                return self.lookup(m, name, depth).map(|mut b| {
                    b.extend(rest.iter().cloned());
                    b
                })
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The absolute path of what `name` means in module `m`: a child module, a name a `use`
    /// binds, or a name a glob import brings.
    fn lookup(&self, m: &[String], name: &str, depth: usize) -> Option<Vec<String>> {
        if depth > DEPTH {
            return None;
        }
        let mut child = m.to_vec();
        child.push(name.to_owned());
        if self.is_module(&child) {
            return Some(child);
        }
        let f = self.files.get(m)?;
        if let Some(u) = f.uses.iter().find(|u| u.name.as_deref() == Some(name)) {
            return self.absolute(m, &u.path, depth + 1);
        }
        if f.defs.contains(name) {
            return None;
        }
        for u in f.uses.iter().filter(|u| u.name.is_none()) {
            let Some(target) = self.absolute(m, &u.path, depth + 1) else {
                continue;
            };
            if self.is_module(&target) && self.visible(&target, name, depth + 1) {
                let mut p = target;
                p.push(name.to_owned());
                return Some(p);
            }
        }
        None
    }

    /// Whether module `m` defines or imports `name`.
    fn visible(&self, m: &[String], name: &str, depth: usize) -> bool {
        let Some(f) = self.files.get(m) else {
            return false;
        };
        f.defs.contains(name) || self.lookup(m, name, depth).is_some()
    }

    /// The file that defines what the absolute path `p` names, with the item's name; None when
    /// `p` names a module itself (the uses of its items are the edges) or no file of the crate.
    fn locate(&self, p: &[String], depth: usize) -> Option<(&File, String)> {
        let mut n = 0;
        while n < p.len() && self.is_module(&p[..=n]) {
            n += 1;
        }
        let item = p.get(n)?;
        let m = &p[..n];
        let f = self.files.get(m)?;
        if depth < DEPTH && !f.defs.contains(item.as_str()) {
            if let Some(mut q) = self.lookup(m, item, depth + 1) {
                q.extend(p[n + 1..].iter().cloned());
                if let Some(found) = self.locate(&q, depth + 1) {
                    return Some(found);
                }
            }
        }
        Some((f, item.clone()))
    }

    /// The edges out of `f`: to file -> the items used.
    fn edges(&self, f: &File) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut add = |abs: Option<Vec<String>>| {
            if let Some((to, item)) = abs.and_then(|a| self.locate(&a, 0)) {
                if to.rel != f.rel {
                    out.entry(to.rel.clone()).or_default().insert(item);
                }
            }
        };
        // A private import is there to be used.
        for u in f.uses.iter().filter(|u| !u.public && u.name.is_some()) {
            add(self.absolute(&f.module, &u.path, 0));
        }
        let code = &f.code;
        for (i, t) in code.iter().enumerate() {
            let Tok::Id(name) = t else { continue };
            let prev = i.checked_sub(1).and_then(|j| code.get(j));
            if is_p(prev, "::") || is_p(prev, ".") {
                continue;
            }
            if is_p(code.get(i + 1), "::") {
                // A path: `head::seg::seg...`.
                let mut path = vec![name.clone()];
                let mut j = i + 1;
                while is_p(code.get(j), "::") {
                    match code.get(j + 1) {
                        Some(Tok::Id(s)) => path.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                add(self.absolute(&f.module, &path, 0));
            } else if !KEYWORDS.contains(&name.as_str())
                && !f.defs.contains(name)
                && !is_p(code.get(i + 1), ":")
            {
                // A bare name a re-export or a glob import brings into this file.
                let bound = f
                    .uses
                    .iter()
                    .any(|u| u.public && u.name.as_deref() == Some(name));
                let globbed = !f.uses.iter().any(|u| u.name.as_deref() == Some(name))
                    && f.uses.iter().any(|u| u.name.is_none());
                if bound || globbed {
                    add(self.lookup(&f.module, name, 0));
                }
            }
        }
        out
    }
}

/// The file-level import graph of the non-test code under `root` (a crate's `src/`): from file
/// -> to file -> the items used.
pub fn file_graph(root: &Path) -> Graph {
    let c = Crate::load(root);
    let mut g = Graph::new();
    for f in c.files.values() {
        let e = c.edges(f);
        if !e.is_empty() {
            g.insert(f.rel.clone(), e);
        }
    }
    g
}

/// A shortest path from `a` to `b` in `g` (both ends included).
fn shortest(g: &Graph, a: &str, b: &str) -> Option<Vec<String>> {
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([a]);
    while let Some(n) = queue.pop_front() {
        for m in g.get(n).map(|e| e.keys()).into_iter().flatten() {
            if m == a || prev.contains_key(m.as_str()) {
                continue;
            }
            prev.insert(m, n);
            if m == b {
                let mut path = vec![b.to_owned()];
                let mut at = b;
                while at != a {
                    at = prev[at];
                    path.push(at.to_owned());
                }
                path.reverse();
                return Some(path);
            }
            queue.push_back(m);
        }
    }
    None
}

/// The cycles of `g`: for every edge on one, a shortest cycle through it (each cycle once,
/// starting at its least file, the first repeated at the end).
pub fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let mut out = BTreeSet::new();
    for (a, tos) in g {
        for b in tos.keys() {
            let Some(mut c) = shortest(g, b, a) else {
                continue;
            };
            c.insert(0, a.clone());
            c.pop();
            let least = c
                .iter()
                .enumerate()
                .min_by_key(|(_, n)| *n)
                .map_or(0, |(i, _)| i);
            c.rotate_left(least);
            c.push(c[0].clone());
            out.insert(c);
        }
    }
    out.into_iter().collect()
}

/// `cycle` as a chain of files, with the items each step uses.
pub fn describe_chain(g: &Graph, cycle: &[String]) -> String {
    cycle
        .windows(2)
        .map(|w| {
            let items = g
                .get(&w[0])
                .and_then(|e| e.get(&w[1]))
                .map(|f| f.iter().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            format!("  {} -> {} ({items})", w[0], w[1])
        })
        .collect::<Vec<_>>()
        .join("\n")
}
