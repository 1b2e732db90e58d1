//! `cargo xtask screenshot`: README's picture of `top`, taken from the emulated demo. The demo
//! runs in a tmux pane of a fixed size; after a while the pane is captured with its colours
//! (`capture-pane -e`) and drawn as SVG text (no font rasteriser needed; any viewer renders it).

use std::{fmt::Write as _, path::Path, process::Command, time::Duration};

use anyhow::{bail, Context as _, Result};

const SESSION: &str = "gpreempt-shot";
const COLS: u16 = 150;
const ROWS: u16 = 34;

/// Runs the demo for `secs` seconds and writes the picture to `out`.
pub fn screenshot(bin: &Path, secs: u64, out: &Path) -> Result<()> {
    let tmux = |args: &[&str]| Command::new("tmux").args(args).output();
    let _ = tmux(&["kill-session", "-t", SESSION]);
    let cmd = format!("{} sim", bin.display());
    let cols = COLS.to_string();
    let rows = ROWS.to_string();
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        SESSION,
        "-x",
        &cols,
        "-y",
        &rows,
        &cmd,
    ])
    .context("starting tmux (apt-get install tmux)")?;
    if !started.status.success() {
        bail!("tmux: {}", String::from_utf8_lossy(&started.stderr));
    }
    std::thread::sleep(Duration::from_secs(secs));
    let shot = tmux(&["capture-pane", "-e", "-p", "-t", SESSION]);
    // Ctrl-C ends the demo, which cleans up after itself; the session goes with it.
    let _ = tmux(&["send-keys", "-t", SESSION, "C-c"]);
    for _ in 0..100 {
        if !tmux(&["has-session", "-t", SESSION]).is_ok_and(|o| o.status.success()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = tmux(&["kill-session", "-t", SESSION]);
    let shot = shot.context("capturing the pane")?;
    let text = String::from_utf8_lossy(&shot.stdout);
    if !text.contains("gpreempt-ebpf top") {
        bail!("the pane does not show top:\n{text}");
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, svg(&text, COLS, ROWS))
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Style {
    fg: Option<u32>,
    bg: Option<u32>,
    bold: bool,
    reverse: bool,
}

/// xterm's 16 colours, then the 256-colour cube and grey ramp.
fn palette(n: u8) -> u32 {
    const BASE: [u32; 16] = [
        0x000000, 0xcd3131, 0x0dbc79, 0xe5e510, 0x2472c8, 0xbc3fbc, 0x11a8cd, 0xe5e5e5, 0x666666,
        0xf14c4c, 0x23d18b, 0xf5f543, 0x3b8eea, 0xd670d6, 0x29b8db, 0xffffff,
    ];
    match n {
        0..=15 => BASE[usize::from(n)],
        16..=231 => {
            let i = u32::from(n - 16);
            let level = |v: u32| if v == 0 { 0 } else { 55 + v * 40 };
            (level(i / 36) << 16) | (level(i / 6 % 6) << 8) | level(i % 6)
        }
        _ => {
            let v = 8 + 10 * u32::from(n - 232);
            (v << 16) | (v << 8) | v
        }
    }
}

/// Applies one SGR sequence's parameters.
fn sgr(style: &mut Style, params: &str) {
    let p: Vec<u32> = params.split(';').map(|x| x.parse().unwrap_or(0)).collect();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            0 => *style = Style::default(),
            1 => style.bold = true,
            22 => style.bold = false,
            7 => style.reverse = true,
            27 => style.reverse = false,
            c @ 30..=37 => style.fg = Some(palette((c - 30) as u8)),
            c @ 90..=97 => style.fg = Some(palette((c - 90 + 8) as u8)),
            39 => style.fg = None,
            c @ 40..=47 => style.bg = Some(palette((c - 40) as u8)),
            c @ 100..=107 => style.bg = Some(palette((c - 100 + 8) as u8)),
            49 => style.bg = None,
            c @ (38 | 48) => {
                let colour = match p.get(i + 1) {
                    Some(5) => {
                        let v = p.get(i + 2).map(|&n| palette(n.min(255) as u8));
                        i += 2;
                        v
                    }
                    Some(2) => {
                        let v = match (p.get(i + 2), p.get(i + 3), p.get(i + 4)) {
                            (Some(r), Some(g), Some(b)) => {
                                Some(((r & 255) << 16) | ((g & 255) << 8) | (b & 255))
                            }
                            _ => None,
                        };
                        i += 4;
                        v
                    }
                    _ => None,
                };
                if c == 38 {
                    style.fg = colour;
                } else {
                    style.bg = colour;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// One line as runs of (column, text, style).
fn runs(line: &str) -> Vec<(usize, String, Style)> {
    let mut out: Vec<(usize, String, Style)> = Vec::new();
    let mut style = Style::default();
    let mut col = 0;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                let mut params = String::new();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        if d == 'm' {
                            sgr(&mut style, &params);
                        }
                        break;
                    }
                    params.push(d);
                }
            }
            continue;
        }
        match out.last_mut() {
            Some((_, text, s)) if *s == style => text.push(c),
            _ => out.push((col, c.to_string(), style)),
        }
        col += 1;
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The pane as SVG: a dark terminal, one <text> per styled run, backgrounds as rectangles.
pub fn svg(pane: &str, cols: u16, rows: u16) -> String {
    const CW: f64 = 8.4;
    const LH: f64 = 17.0;
    const FG: u32 = 0xd4d4d4;
    const BG: u32 = 0x1e1e1e;
    let (w, h) = (f64::from(cols) * CW + 16.0, f64::from(rows) * LH + 16.0);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" \
         font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\" font-size=\"14\">\
         <rect width=\"100%\" height=\"100%\" fill=\"#{BG:06x}\"/>"
    );
    for (row, line) in pane.lines().take(usize::from(rows)).enumerate() {
        let y = 8.0 + row as f64 * LH;
        for (col, text, st) in runs(line) {
            let (mut fg, mut bg) = (st.fg.unwrap_or(FG), st.bg);
            if st.reverse {
                (fg, bg) = (bg.unwrap_or(BG), Some(fg));
            }
            let x = 8.0 + col as f64 * CW;
            let n = text.chars().count() as f64;
            if let Some(bg) = bg {
                let _ = write!(
                    s,
                    "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{LH}\" fill=\"#{bg:06x}\"/>",
                    n * CW
                );
            }
            if text.trim().is_empty() {
                continue;
            }
            let _ = write!(
                s,
                "<text x=\"{x:.1}\" y=\"{:.1}\" fill=\"#{fg:06x}\" xml:space=\"preserve\"{}>{}</text>",
                y + 13.0,
                if st.bold { " font-weight=\"bold\"" } else { "" },
                escape(&text)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_reverse_and_escaping_reach_the_svg() {
        let pane = "\u{1b}[1;38;5;196mPID\u{1b}[0m <a&b> \u{1b}[7mSEL\u{1b}[27m\n\u{1b}[48;2;1;2;3m bg \u{1b}[49m";
        let out = svg(pane, 20, 2);
        assert!(
            out.contains("fill=\"#ff0000\" xml:space=\"preserve\" font-weight=\"bold\">PID<"),
            "{out}"
        );
        assert!(out.contains("&lt;a&amp;b&gt;"), "{out}");
        // Reverse video: the default background as text colour on the default foreground.
        assert!(out.contains("fill=\"#d4d4d4\"/><text"), "{out}");
        assert!(
            out.contains("fill=\"#1e1e1e\" xml:space=\"preserve\">SEL<"),
            "{out}"
        );
        assert!(out.contains("fill=\"#010203\""), "{out}");
        assert!(out.starts_with("<svg") && out.ends_with("</svg>\n"));
    }

    #[test]
    fn runs_keep_columns_across_escapes() {
        let r = runs("ab\u{1b}[31mcd\u{1b}[0me");
        let cols: Vec<(usize, &str)> = r.iter().map(|(c, t, _)| (*c, t.as_str())).collect();
        assert_eq!(cols, vec![(0, "ab"), (2, "cd"), (4, "e")]);
        assert_eq!(palette(196), 0xff0000);
        assert_eq!(palette(232), 0x080808);
    }
}
