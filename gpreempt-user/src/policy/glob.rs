//! Shell-style glob patterns for the `comm`, `cgroup` and `container` matchers of a rule.

/// A shell-style glob: `*` (any run of characters, `/` included), `?` (one character),
/// `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]`, and `\` to quote the next character. Matches the whole
/// string.
#[derive(Clone, Debug)]
pub struct Glob {
    pattern: String,
    toks: Vec<Tok>,
}

#[derive(Clone, Debug)]
enum Tok {
    Lit(char),
    Any,
    Star,
    Class {
        negate: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Self, String> {
        let mut toks = Vec::new();
        let mut it = pattern.chars().peekable();
        while let Some(c) = it.next() {
            toks.push(match c {
                '*' => {
                    // `**` means the same as `*`.
                    if matches!(toks.last(), Some(Tok::Star)) {
                        continue;
                    }
                    Tok::Star
                }
                '?' => Tok::Any,
                '\\' => Tok::Lit(it.next().ok_or("dangling '\\' at the end")?),
                '[' => {
                    let negate = it.next_if(|&c| c == '!' || c == '^').is_some();
                    let mut ranges = Vec::new();
                    let mut closed = false;
                    let mut first = true;
                    while let Some(c) = it.next() {
                        // A `]` first in the set is a literal (POSIX).
                        if c == ']' && !first {
                            closed = true;
                            break;
                        }
                        first = false;
                        let lo = if c == '\\' {
                            it.next().ok_or("dangling '\\' in a [...] set")?
                        } else {
                            c
                        };
                        let mut hi = lo;
                        if it.peek() == Some(&'-') {
                            let mut ahead = it.clone();
                            ahead.next();
                            match ahead.peek() {
                                Some(&']') | None => {}
                                Some(_) => {
                                    it.next();
                                    let h = it.next().ok_or("unclosed '['")?;
                                    hi = if h == '\\' {
                                        it.next().ok_or("dangling '\\' in a [...] set")?
                                    } else {
                                        h
                                    };
                                    if hi < lo {
                                        return Err(format!("range '{lo}-{hi}' is reversed"));
                                    }
                                }
                            }
                        }
                        ranges.push((lo, hi));
                    }
                    if !closed {
                        return Err("unclosed '['".into());
                    }
                    Tok::Class { negate, ranges }
                }
                c => Tok::Lit(c),
            });
        }
        Ok(Self {
            pattern: pattern.to_owned(),
            toks,
        })
    }

    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn matches(&self, s: &str) -> bool {
        // Iterative matching with one backtrack point (the last `*`): linear in practice,
        // O(pattern x text) at worst, never exponential.
        let text: Vec<char> = s.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            let step = match self.toks.get(p) {
                Some(Tok::Star) => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                Some(Tok::Lit(c)) => *c == text[t],
                Some(Tok::Any) => true,
                Some(Tok::Class { negate, ranges }) => {
                    let c = text[t];
                    ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negate
                }
                None => false,
            };
            if step {
                p += 1;
                t += 1;
            } else if let Some((sp, st)) = star {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            } else {
                return false;
            }
        }
        self.toks[p..].iter().all(|t| matches!(t, Tok::Star))
    }
}
