//! The policies a reader copies: every file in `examples/` and every ```toml block in README.md
//! and docs/*.md goes through `policy check` (the parser `run` uses). A doc example that does not
//! parse fails here. A block that is deliberately partial is marked on the line before its fence
//! with `<!-- policy: fragment: WHY -->` and skipped; a marker must say why and must sit on a
//! toml block. No root, no GPU.

use std::path::{Path, PathBuf};

use gpreempt_user::cmd::policy::{check_text, host_group};
use gpreempt_user::controller::record::AuditRecord;
use gpreempt_user::policy::LintKind;
use tests::{join_lexically, md_anchors, md_links};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// README.md and docs/*.md, as paths relative to the repository.
fn markdown() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            p.strip_prefix(repo())
                .expect("under the repo")
                .to_path_buf()
        })
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// One fenced block of a markdown file.
#[derive(Debug)]
struct Block {
    /// The info string after the opening fence (`toml`, `sh`, empty).
    lang: String,
    /// 1-based line of the opening fence.
    fence: usize,
    /// The content, its fence's indentation removed.
    text: String,
    /// The `<!-- policy: ... -->` marker on the line before the fence, if any.
    marker: Option<String>,
}

fn blocks(md: &str) -> Vec<Block> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let indent = l.len() - l.trim_start().len();
        let Some(info) = l.trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let marker = i
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|p| p.strip_prefix("<!-- policy:"))
            .and_then(|p| p.strip_suffix("-->"))
            .map(|p| p.trim().to_owned());
        let fence = i + 1;
        let mut text = String::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            let body = lines[i];
            let cut = body.len() - body.trim_start().len();
            text.push_str(&body[cut.min(indent)..]);
            text.push('\n');
            i += 1;
        }
        assert!(i < lines.len(), "the block at line {fence} is never closed");
        i += 1;
        out.push(Block {
            lang: info.trim().to_owned(),
            fence,
            text,
            marker,
        });
    }
    out
}

/// Markers that are not on a block's fence line: stale or misplaced.
fn stray_markers(md: &str) -> Vec<usize> {
    let lines: Vec<&str> = md.lines().collect();
    (0..lines.len())
        .filter(|&i| lines[i].trim_start().starts_with("<!-- policy:"))
        .filter(|&i| {
            !lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("```toml"))
        })
        .map(|i| i + 1)
        .collect()
}

/// The problems `policy check` finds in a policy, as a reader of `source` would want them:
/// errors, and warnings that an example must not have. `line0` lines precede the text in its
/// file, so the messages carry the file's own line numbers.
fn problems(source: &str, line0: usize, text: &str, strict: bool) -> Vec<String> {
    let padded = format!("{}{text}", "\n".repeat(line0));
    let r = check_text(&padded, source, &host_group);
    let mut out = r.errors;
    if let Some(p) = r.policy {
        // A doc or example that teaches a rule a process can claim by renaming itself teaches
        // the wrong thing (docs/policy.md); a pid rule or a policy that never acts is allowed
        // in a doc's reference block, never in an example file. Host checks (a group missing on
        // this machine) are the controller's host's question, not the example's.
        for l in p.lints() {
            let bad = match l.kind {
                LintKind::Spoofable => true,
                LintKind::Pid | LintKind::NeverActs => strict,
            };
            if bad {
                out.push(l.located(source));
            }
        }
    }
    out
}

#[test]
fn every_toml_block_in_the_docs_passes_policy_check() {
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    let mut skipped = Vec::new();
    for md in markdown() {
        let name = md.display().to_string();
        let text =
            std::fs::read_to_string(repo().join(&md)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for line in stray_markers(&text) {
            failures.push(format!(
                "{name}:{line}: a policy marker not on the line before a ```toml fence"
            ));
        }
        for b in blocks(&text) {
            if b.lang != "toml" {
                // A policy in an untagged block would escape the check.
                if let Some(l) = b
                    .text
                    .lines()
                    .position(|l| l.starts_with("[[rule]]") || l.starts_with("[policy]"))
                {
                    failures.push(format!(
                        "{name}:{}: a policy in a ```{} block: tag it ```toml so it is checked",
                        b.fence + 1 + l,
                        b.lang
                    ));
                }
                continue;
            }
            if let Some(m) = b.marker.as_deref() {
                match m.strip_prefix("fragment:").map(str::trim) {
                    Some(why) if !why.is_empty() => {
                        skipped.push(format!("{name}:{}", b.fence));
                        continue;
                    }
                    _ => failures.push(format!(
                        "{name}:{}: marker {m:?}: write `<!-- policy: fragment: WHY -->`",
                        b.fence - 1
                    )),
                }
            }
            checked.push(format!("{name}:{}", b.fence));
            failures.extend(problems(&name, b.fence, &b.text, false));
        }
    }
    eprintln!("checked {checked:?}; skipped as fragments {skipped:?}");
    assert!(
        failures.is_empty(),
        "doc policies that `gpreempt-ebpf policy check` refuses:\n{}",
        failures.join("\n")
    );
    // The docs have policy examples (policy.md's reference, adaptive and NVIDIA blocks, and
    // service.md's pod rules): none may go unseen by a broken extractor.
    assert!(checked.len() >= 3, "only {checked:?} checked");
    assert!(
        checked.iter().any(|c| c.starts_with("docs/policy.md:"))
            && checked.iter().any(|c| c.starts_with("docs/service.md:")),
        "{checked:?}"
    );
    // Fragments are the exception: a few, each justified in its marker.
    assert!(skipped.len() <= 3, "too many fragments: {skipped:?}");
}

#[test]
fn every_example_file_passes_policy_check_without_warnings() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("examples"), &mut files);
    files.sort();
    let mut failures = Vec::new();
    for f in &files {
        let name = f.strip_prefix(repo()).unwrap_or(f).display().to_string();
        let text =
            gpreempt_user::policy::read_policy_file(f).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        failures.extend(problems(&name, 0, &text, true));
    }
    assert!(
        failures.is_empty(),
        "example policies that `gpreempt-ebpf policy check` refuses or warns about:\n{}",
        failures.join("\n")
    );
    // Both vendors' examples, and an adaptive one each, are among them.
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(repo()).unwrap_or(f).display().to_string())
        .collect();
    for want in [
        "examples/resnet-online-offline.toml",
        "examples/amd-adaptive.toml",
        "examples/nvidia.toml",
        "examples/nvidia-adaptive.toml",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves_with_its_anchor() {
    let mut broken = Vec::new();
    let mut seen = 0;
    for md in markdown() {
        let name = md.display().to_string();
        let path = repo().join(&md);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let dir = path.parent().expect("a file's directory");
        for (line, link) in md_links(&text) {
            seen += 1;
            let (file, anchor) = match link.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                path.clone()
            } else {
                join_lexically(dir, file)
            };
            if !target.exists() {
                broken.push(format!("{name}:{line}: {link}: no such file"));
                continue;
            }
            if let (Some(a), true) = (anchor, target.extension().is_some_and(|x| x == "md")) {
                let t = std::fs::read_to_string(&target).expect("a markdown file");
                if !md_anchors(&t).contains(a) {
                    broken.push(format!("{name}:{line}: {link}: no heading makes #{a}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(seen > 50, "only {seen} links found");
}

/// Every `"action"` of the controller's audit record type is in controller.md's audit table.
#[test]
fn every_audit_action_the_controller_writes_is_documented() {
    let doc = std::fs::read_to_string(repo().join("docs/controller.md")).expect("controller.md");
    let table = doc
        .split("### Audit log")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("controller.md's audit section");
    // Told of an action it does not know, serde names every one the type has.
    let e = serde_json::from_str::<AuditRecord>(r#"{"action":"?"}"#)
        .expect_err("an unknown action")
        .to_string();
    let actions: Vec<&str> = e
        .split("expected one of ")
        .nth(1)
        .unwrap_or_default()
        .split(", ")
        .filter_map(|a| a.split('`').nth(1))
        .collect();
    assert!(actions.len() >= 5, "{actions:?} from {e:?}");
    for a in &actions {
        assert!(
            table.contains(&format!("| `{a}`")) || table.contains(&format!(", `{a}`")),
            "audit action {a:?} (controller/record.rs) is not in docs/controller.md's audit table"
        );
    }
}

/// The Debian packages `cargo xtask test` installs are those CI installs and the README and
/// docs/testing.md name.
#[test]
fn the_test_package_lists_agree() {
    let read =
        |p: &str| std::fs::read_to_string(repo().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let xtask = read("xtask/src/main.rs");
    let body = xtask
        .split("fn test_packages()")
        .nth(1)
        .and_then(|t| t.split("])").next())
        .expect("test_packages in xtask/src/main.rs");
    let pkgs: Vec<&str> = body
        .split("(\"")
        .skip(1)
        .filter_map(|t| t.split('"').next())
        .collect();
    assert!(pkgs.len() >= 10, "{pkgs:?}");
    let ci = read(".ci/run");
    let install = ci
        .lines()
        .skip_while(|l| !l.contains("apt-get install"))
        .take_while(|l| !l.contains("cargo xtask ci"))
        .collect::<Vec<_>>()
        .join(" ");
    // The parenthesised list after "Debian packages the tests use".
    let listed = |name: &str| -> Vec<String> {
        let text = read(name);
        let after = text
            .split("Debian packages the tests use")
            .nth(1)
            .unwrap_or_else(|| panic!("{name}: no \"Debian packages the tests use\""));
        let list = after
            .split_once('(')
            .and_then(|(_, t)| t.split_once(')'))
            .map(|(l, _)| l)
            .unwrap_or_else(|| panic!("{name}: no list after \"Debian packages the tests use\""));
        list.split([',', ':', ' ', '\n'])
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (readme, testing) = (listed("README.md"), listed("docs/testing.md"));
    for p in &pkgs {
        assert!(
            install.split_whitespace().any(|w| w == *p),
            ".ci/run does not install {p}"
        );
        assert!(
            readme.iter().any(|w| w == p),
            "README.md does not list {p}: {readme:?}"
        );
        assert!(
            testing.iter().any(|w| w == p),
            "docs/testing.md does not list {p}: {testing:?}"
        );
    }
}

/// The figures a text quotes: a number with a decimal point or a unit (ms, us, µs, x, %, MB), or
/// a range of two (`0.68-0.69`), as written, without the unit. Dates, versions (`580.159.04`),
/// counts (`8 pairs`) and numbers inside words (`H100`, `p99`, `2-vCPU`) are not figures.
fn figures(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let number = |mut i: usize| -> (usize, usize) {
        // (end, dots)
        let mut dots = 0;
        while i < b.len()
            && (b[i].is_ascii_digit()
                || (b[i] == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit()))
        {
            dots += usize::from(b[i] == b'.');
            i += 1;
        }
        (i, dots)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b".,-_".contains(&b[i - 1])));
        if !starts {
            i += 1;
            continue;
        }
        let (mut end, mut dots) = number(i);
        let mut parts = 1;
        while end + 1 < b.len() && b[end] == b'-' && b[end + 1].is_ascii_digit() {
            let (e, d) = number(end + 1);
            (end, dots, parts) = (e, dots.max(d), parts + 1);
        }
        let token = &text[i..end];
        let rest = text[end..].strip_prefix(' ').unwrap_or(&text[end..]);
        let unit = ["ms", "us", "µs", "x", "%", "MB"].iter().any(|u| {
            rest.strip_prefix(u)
                .is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric()))
        });
        let word = text[end..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
        // A date (three parts) or a version (two dots in a part) is no figure.
        if parts <= 2 && dots <= 1 && (unit || (token.contains('.') && !word)) {
            out.push(token.to_string());
        }
        i = end;
    }
    out
}

/// Where `figure` stands in `doc` as written (not inside a longer number), and the text that
/// labels it there: the heading of its section and its paragraph (a table is one paragraph).
fn places<'a>(doc: &'a str, figure: &str) -> Vec<(&'a str, String)> {
    let mut out = Vec::new();
    let mut heading = "";
    let mut para: Vec<&str> = Vec::new();
    let flush = |heading: &'a str, para: &mut Vec<&str>, out: &mut Vec<(&'a str, String)>| {
        let text = para.join("\n");
        let found = text.match_indices(figure).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + figure.len()..].chars().next();
            let tail = &text[at + figure.len()..];
            let longer = before.is_some_and(|c| c.is_ascii_digit() || c == '.' || c == '-')
                || after.is_some_and(|c| c.is_ascii_digit() || c == '-')
                || tail
                    .strip_prefix('.')
                    .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit()));
            !longer
        });
        if found {
            out.push((heading, text));
        }
        para.clear();
    };
    for line in doc.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            flush(heading, &mut para, &mut out);
            if line.starts_with('#') {
                heading = line;
            }
        } else {
            para.push(line);
        }
    }
    flush(heading, &mut para, &mut out);
    out
}

/// What README's "Status: what is measured" quotes that the docs its bullets link do not say,
/// as written and labelled: an "Emulated" bullet's figures under a heading or in a paragraph
/// labelled emulated, a "Real GPUs" bullet's next to H100 or H200 and not under an emulated
/// heading. `doc` reads a linked file (a path relative to the repository).
fn unsourced(status: &str, doc: &dyn Fn(&str) -> String) -> (usize, Vec<String>) {
    let emulated = |t: &str| {
        let t = t.to_lowercase();
        t.contains("emulated") && !t.contains("not emulated")
    };
    let real = |t: &str| t.contains("H100") || t.contains("H200");
    let mut checked = 0;
    let mut missing = Vec::new();
    for bullet in status.split("\n- ").skip(1) {
        let label = bullet
            .strip_prefix("**")
            .and_then(|b| b.split_once("**"))
            .map_or("", |(l, _)| l);
        let mut linked: Vec<String> = md_links(bullet)
            .into_iter()
            .map(|(_, l)| l.split('#').next().unwrap_or("").to_string())
            .filter(|l| l.ends_with(".md"))
            .collect();
        linked.sort();
        linked.dedup();
        if linked.is_empty() {
            missing.push(format!("\"{label}\": links no doc for its figures"));
            continue;
        }
        let texts: Vec<(String, String)> = linked.iter().map(|l| (l.clone(), doc(l))).collect();
        for f in figures(bullet) {
            checked += 1;
            let ok = texts.iter().any(|(_, t)| {
                places(t, &f).iter().any(|(h, p)| match label {
                    "Emulated" => emulated(h) || emulated(p),
                    "Real GPUs" => !emulated(h) && (real(h) || real(p)),
                    _ => true,
                })
            });
            if !ok {
                missing.push(format!(
                    "\"{label}\": {f} is not in {linked:?} as written, labelled"
                ));
            }
        }
    }
    (checked, missing)
}

/// One source for figures: every figure README's status quotes is in the doc its bullet links,
/// written the same way, next to its label (emulated, H100/H200). A figure changes in the doc
/// first; README copies it.
#[test]
fn every_figure_readme_quotes_is_in_the_doc_it_links_labelled() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let status = readme
        .split("\n## Status: what is measured\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README's \"Status: what is measured\" section");
    let doc = |l: &str| {
        std::fs::read_to_string(repo().join(l)).unwrap_or_else(|e| panic!("README links {l}: {e}"))
    };
    let (checked, missing) = unsourced(status, &doc);
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    assert!(
        checked > 40,
        "only {checked} figures found in README's status"
    );
    for label in ["**Emulated**", "**Real GPUs**"] {
        assert!(
            status.contains(&format!("\n- {label}")),
            "no {label} bullet"
        );
    }
}

#[test]
fn the_figure_check_catches_a_changed_an_unlabelled_and_an_unlinked_figure() {
    assert_eq!(
        figures(
            "p99 10.5-11.2 ms at 0.68x (H100, 2026-11-22, driver 580.159.04, 8 pairs, 2-vCPU VM, \
             10,000 queues, +216%, 6.48 to 5.94, 3-4 rounds, 1 µs)"
        ),
        ["10.5-11.2", "0.68", "216", "6.48", "5.94", "1"]
    );
    let doc = |l: &str| match l {
        "docs/a.md" => {
            "# A (emulated)\n\n| p99 | 10.5-11.2 | 0.68 |\n\n# B\n\nH100: 5.94 ms, 3.7 ms\n\n\
                        # C\n\nno label: 6.48 ms, 110.5-11.2\n"
                .to_string()
        }
        _ => String::new(),
    };
    let status = "\n- **Emulated** ([a](docs/a.md)): 10.5-11.2 ms at 0.68x, 0.69x, 5.94 ms\n\
                  - **Real GPUs** ([a](docs/a.md)): 5.94 ms, 6.48 ms, 3.7x, 10.5-11.3\n\
                  - **Overheads**: 1.42%\n";
    let (checked, missing) = unsourced(status, &doc);
    assert_eq!(checked, 8);
    assert_eq!(
        missing,
        [
            // changed
            "\"Emulated\": 0.69 is not in [\"docs/a.md\"] as written, labelled",
            // in the doc, under another label
            "\"Emulated\": 5.94 is not in [\"docs/a.md\"] as written, labelled",
            "\"Real GPUs\": 6.48 is not in [\"docs/a.md\"] as written, labelled",
            "\"Real GPUs\": 10.5-11.3 is not in [\"docs/a.md\"] as written, labelled",
            "\"Overheads\": links no doc for its figures",
        ]
    );
}

#[test]
fn the_extractor_finds_fences_markers_and_lines() {
    let md = "intro\n\n```toml\n[policy]\n```\n\n<!-- policy: fragment: only rules -->\n\
              ```toml\n[[rule]]\n```\n\n- item\n\n  ```\n  [[rule]]\n  ```\n\
              <!-- policy: fragment: x -->\ntext\n";
    let b = blocks(md);
    assert_eq!(b.len(), 3, "{b:#?}");
    assert_eq!((b[0].lang.as_str(), b[0].fence), ("toml", 3));
    assert_eq!(b[0].text, "[policy]\n");
    assert_eq!(b[0].marker, None);
    assert_eq!(b[1].marker.as_deref(), Some("fragment: only rules"));
    assert_eq!((b[2].lang.as_str(), b[2].text.as_str()), ("", "[[rule]]\n"));
    assert_eq!(stray_markers(md), [17]);
    // Errors carry the file's own line numbers.
    let p = problems("x.md", 9, "[policy]\nwindow = \"1xs\"\n", false);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("x.md:11: window:"), "{p:?}");
    // A rule on comm alone fails a doc block; a pid rule only an example.
    let spoof =
        "[[rule]]\nclass = \"online\"\ncomm = \"a\"\n\n[[rule]]\nclass = \"offline\"\npid = 7\n";
    let p = problems("x.md", 0, spoof, false);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(problems("x.toml", 0, spoof, true).len(), 2);
    // Links and the anchors headings make.
    let md = "# Top `cmd` --json\n\n## Top `cmd` --json\n[a](b.md#top-cmd---json) [u](https://x) \
              [s](#top-cmd---json-1)\n```\n[not](a link)\n# not a heading\n```\n";
    assert_eq!(
        md_links(md),
        [
            (4, "b.md#top-cmd---json".to_string()),
            (4, "#top-cmd---json-1".to_string())
        ]
    );
    let a = md_anchors(md);
    assert!(
        a.contains("top-cmd---json") && a.contains("top-cmd---json-1"),
        "{a:?}"
    );
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(
        join_lexically(Path::new("/r/docs"), "../examples/./x.toml"),
        Path::new("/r/examples/x.toml")
    );
}
