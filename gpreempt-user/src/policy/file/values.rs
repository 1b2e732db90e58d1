//! One value of the type a key wants, or a problem at its line saying what was found.

use toml::de::{DeTable, DeValue};

use super::super::Class;
use super::{parse_duration, Parser, Val};

impl Parser<'_> {
    pub(super) fn table<'a, 'i>(&mut self, v: &'a Val<'i>, what: &str) -> Option<&'a DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            other => {
                self.err(
                    v.span().start,
                    format!("{what} must be a table, not {}", other.type_str()),
                );
                None
            }
        }
    }

    pub(super) fn string<'a>(&mut self, v: &'a Val, key: &str) -> Option<&'a str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.err(
                    v.span().start,
                    format!("{key}: expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    pub(super) fn duration(&mut self, v: &Val, key: &str) -> Option<u64> {
        if let DeValue::Integer(_) | DeValue::Float(_) = v.get_ref() {
            self.err(
                v.span().start,
                format!(
                    "{key}: a duration needs a unit and quotes, e.g. \"{}ms\"",
                    self.text.get(v.span()).unwrap_or("20")
                ),
            );
            return None;
        }
        let s = self.string(v, key)?;
        match parse_duration(s) {
            Ok(ns) => Some(ns),
            Err(e) => {
                self.err(v.span().start, format!("{key}: {e}"));
                None
            }
        }
    }

    /// A non-negative integer that fits a u32.
    pub(super) fn integer(&mut self, v: &Val, key: &str) -> Option<u64> {
        let DeValue::Integer(i) = v.get_ref() else {
            self.err(
                v.span().start,
                format!(
                    "{key}: expected an integer, found {}",
                    v.get_ref().type_str()
                ),
            );
            return None;
        };
        match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) if (0..=i128::from(u32::MAX)).contains(&n) => Some(n as u64),
            _ => {
                self.err(
                    v.span().start,
                    format!("{key}: {} is out of range (0 to {})", i, u32::MAX),
                );
                None
            }
        }
    }

    pub(super) fn float(&mut self, v: &Val, key: &str) -> Option<f64> {
        let parsed = match v.get_ref() {
            DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
            DeValue::Integer(i) => i128::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|n| n as f64),
            _ => None,
        };
        if parsed.is_none() {
            self.err(
                v.span().start,
                format!("{key}: expected a number, found {}", v.get_ref().type_str()),
            );
        }
        parsed
    }

    pub(super) fn class(&mut self, v: &Val, key: &str) -> Option<Class> {
        let s = self.string(v, key)?;
        let c = Class::parse(s);
        if c.is_none() {
            self.err(
                v.span().start,
                format!("{key}: unknown class {s:?} (use \"online\", \"offline\" or \"ignore\")"),
            );
        }
        c
    }

    pub(super) fn gpus(&mut self, v: &Val) -> Option<Vec<u32>> {
        match v.get_ref() {
            DeValue::String(s) if s.as_ref() == "all" => None,
            DeValue::Array(a) if !a.is_empty() => {
                let mut ids: Vec<u32> = a
                    .iter()
                    .filter_map(|e| self.integer(e, "gpus").map(|n| n as u32))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                Some(ids)
            }
            _ => {
                self.err(
                    v.span().start,
                    "gpus: use \"all\" or a non-empty list of KFD gpu_ids, e.g. [0x1234]".into(),
                );
                None
            }
        }
    }
}
