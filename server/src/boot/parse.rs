//! The boot endpoint's decoders of peer bytes: the query's MAC address,
//! the `Range` and `Host` headers, and the MAC addresses a joining node
//! reports. Each is a small pure function with
//! property tests: whatever a PXE client sends decodes or is refused, and
//! what decodes is safe to put into a script.

pub use bc_store::images::{MAX_MACS, parse_mac};

/// The MAC addresses a join reported, as the store keeps them (parsed,
/// deduplicated, sorted); a list that is too long or holds something else
/// is refused.
pub fn join_macs(macs: &[String]) -> Result<Vec<String>, String> {
    if macs.len() > MAX_MACS {
        return Err(format!(
            "the join reports {} MAC addresses; at most {MAX_MACS}",
            macs.len()
        ));
    }
    let mut out = macs
        .iter()
        .map(|m| {
            parse_mac(m).ok_or_else(|| {
                format!(
                    "the join reports {:?} as a MAC address: send six hex pairs joined by ':' \
                     (52:54:00:12:34:56)",
                    m.chars().take(40).collect::<String>()
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// The `mac` parameter of a query string, percent-decoded (iPXE's
/// `${net0/mac:uristring}` writes `52%3A54%3A...`).
pub fn query_mac(query: &str) -> Option<String> {
    let (_, v) = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "mac")?;
    parse_mac(&percent_encoding::percent_decode_str(v).decode_utf8().ok()?)
}

/// A `Range` header against a body of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// Serve the whole body: no header, or one we ignore (several ranges,
    /// another unit, bad syntax), as RFC 9110 allows.
    Whole,
    /// Bytes `start..=end`.
    Part { start: u64, end: u64 },
    /// Nothing of the body is in the range: 416.
    Unsatisfiable,
}

pub fn parse_range(header: Option<&str>, len: u64) -> Range {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Range::Whole;
    };
    if spec.contains(',') {
        return Range::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Range::Whole;
    };
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.len() <= 20 && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (a.trim(), b.trim()) {
        ("", suffix) => match num(suffix) {
            None => Range::Whole,
            Some(0) => Range::Unsatisfiable,
            Some(_) if len == 0 => Range::Unsatisfiable,
            Some(n) => Range::Part {
                start: len.saturating_sub(n),
                end: len - 1,
            },
        },
        (start, end) => {
            let Some(start) = num(start) else {
                return Range::Whole;
            };
            let end = match end {
                "" => None,
                e => match num(e) {
                    Some(e) => Some(e),
                    None => return Range::Whole,
                },
            };
            if end.is_some_and(|e| e < start) {
                return Range::Whole;
            }
            if start >= len {
                return Range::Unsatisfiable;
            }
            Range::Part {
                start,
                end: end.map_or(len - 1, |e| e.min(len - 1)),
            }
        }
    }
}

/// A Host header that is safe to put into a script: a host name or
/// address and an optional port, nothing else.
pub fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn macs_in_every_form_ipxe_writes() {
        let want = Some("52:54:00:12:ab:cd".to_string());
        assert_eq!(parse_mac("52:54:00:12:AB:CD"), want);
        assert_eq!(parse_mac("52-54-00-12-ab-cd"), want);
        assert_eq!(query_mac("mac=52%3A54%3A00%3A12%3Aab%3Acd"), want);
        assert_eq!(query_mac("mac=52%3a54%3a00%3a12%3aAB%3aCD&x=%FF"), want);
        assert_eq!(query_mac("mac=52%3A54%3A00%3A12%3Aab%3Acd%FF"), None);
        assert_eq!(parse_mac("52%3A54%3A00%3A12%3Aab%3Acd"), None);
        assert_eq!(parse_mac("52:54:00:12:ab"), None);
        assert_eq!(parse_mac("52:54:00:12:ab:cd:ef"), None);
        assert_eq!(parse_mac("5:254:00:12:ab:cd"), None);
        assert_eq!(parse_mac("zz:54:00:12:ab:cd"), None);
        assert_eq!(query_mac("x=1&mac=52:54:00:12:ab:cd"), want);
        assert_eq!(query_mac("mac="), None);
        assert_eq!(query_mac(""), None);
    }

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        assert_eq!(parse_range(None, 100), Range::Whole);
        assert_eq!(
            parse_range(Some("bytes=0-9"), 100),
            Range::Part { start: 0, end: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=90-"), 100),
            Range::Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=90-500"), 100),
            Range::Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=-10"), 100),
            Range::Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=-500"), 100),
            Range::Part { start: 0, end: 99 }
        );
        assert_eq!(parse_range(Some("bytes=100-"), 100), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 100), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=5-1"), 100), Range::Whole);
        assert_eq!(parse_range(Some("bytes=0-1,5-6"), 100), Range::Whole);
        assert_eq!(parse_range(Some("items=0-1"), 100), Range::Whole);
        assert_eq!(parse_range(Some("bytes=a-b"), 100), Range::Whole);
        assert_eq!(
            parse_range(Some("bytes=99999999999999999999999-"), 100),
            Range::Whole
        );
    }

    #[test]
    fn reported_macs() {
        assert_eq!(
            join_macs(&[
                "52-54-00-12-34-AB".into(),
                "02:bc:00:00:00:2a".into(),
                "52:54:00:12:34:ab".into()
            ]),
            Ok(vec![
                "02:bc:00:00:00:2a".to_string(),
                "52:54:00:12:34:ab".to_string()
            ])
        );
        let e = join_macs(&["eth0".into()]).unwrap_err();
        assert!(e.contains("\"eth0\"") && e.contains("six hex pairs"), "{e}");
        let e = join_macs(&vec!["52:54:00:12:34:ab".to_string(); 65]).unwrap_err();
        assert!(e.contains("at most 64"), "{e}");
    }

    #[test]
    fn hosts() {
        assert!(valid_host("10.0.2.100:8080"));
        assert!(valid_host("[::1]:80"));
        assert!(valid_host("boot.example.org"));
        assert!(!valid_host("a b"));
        assert!(!valid_host("x\nkernel http://evil/"));
        assert!(!valid_host(""));
    }

    proptest! {
        #[test]
        fn any_range_header_is_within_the_body(h in "\\PC{0,40}", len in 0u64..10_000) {
            match parse_range(Some(&h), len) {
                Range::Part { start, end } => prop_assert!(start <= end && end < len),
                Range::Whole | Range::Unsatisfiable => {}
            }
        }

        #[test]
        fn byte_ranges_cover_what_they_ask(start in 0u64..200, n in 0u64..200, len in 1u64..150) {
            let r = parse_range(Some(&format!("bytes={start}-{}", start + n)), len);
            if start >= len {
                prop_assert_eq!(r, Range::Unsatisfiable);
            } else {
                prop_assert_eq!(r, Range::Part { start, end: (start + n).min(len - 1) });
            }
        }

        #[test]
        fn any_query_gives_a_normal_mac_or_none(q in "\\PC{0,60}") {
            if let Some(m) = query_mac(&q) {
                prop_assert_eq!(parse_mac(&m), Some(m.clone()));
                prop_assert_eq!(m.len(), 17);
            }
        }

        #[test]
        fn every_mac_reads_back(b in proptest::array::uniform6(any::<u8>()), hyphen in any::<bool>()) {
            let sep = if hyphen { "-" } else { ":" };
            let s = b.iter().map(|x| format!("{x:02X}")).collect::<Vec<_>>().join(sep);
            let want = b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":");
            prop_assert_eq!(parse_mac(&s), Some(want));
        }

        #[test]
        fn any_reported_macs_are_normal_sorted_and_unique_or_refused(
            ms in proptest::collection::vec("[0-9a-fA-F:%3A-]{0,20}|\\PC{0,20}", 0..70)
        ) {
            match join_macs(&ms) {
                Ok(out) => {
                    prop_assert!(ms.len() <= MAX_MACS && out.len() <= ms.len());
                    prop_assert!(out.windows(2).all(|w| w[0] < w[1]));
                    for m in &out {
                        prop_assert_eq!(parse_mac(m), Some(m.clone()));
                    }
                }
                Err(e) => prop_assert!(e.contains("at most") || e.contains("six hex pairs")),
            }
        }

        #[test]
        fn a_valid_host_never_breaks_a_script_line(h in "\\PC{0,40}") {
            if valid_host(&h) {
                prop_assert!(!h.contains(['\n', '\r', ' ', '$', '"']));
            }
        }
    }
}
