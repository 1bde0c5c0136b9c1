//! Splitting a large JSON `List` into its items without parsing them, so the fast path can
//! parse the items on several threads. A light scanner: it tracks strings (with escapes) and
//! nesting only; each item is then parsed, and so validated, by serde. Anything it does not
//! understand answers `None` and the caller falls back to parsing the whole document.

/// The list's `kind` and the bytes of each element of its `items`, in order.
pub(super) fn list(bytes: &[u8]) -> Option<(String, Vec<&[u8]>)> {
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let (mut kind, mut items) = (None, None);
    loop {
        i = skip_ws(bytes, i);
        match bytes.get(i)? {
            b'}' => break,
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let (key, next) = string(bytes, i)?;
        i = skip_ws(bytes, next);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(bytes, i + 1);
        match key {
            b"kind" => {
                let (value, next) = string(bytes, i)?;
                if value.contains(&b'\\') {
                    return None;
                }
                kind = Some(std::str::from_utf8(value).ok()?.to_string());
                i = next;
            }
            b"items" => {
                let (elements, next) = elements(bytes, i)?;
                items = Some(elements);
                i = next;
            }
            _ => i = skip_value(bytes, i)?,
        }
    }
    if bytes[i + 1..].iter().any(|b| !b.is_ascii_whitespace()) {
        return None;
    }
    Some((kind?, items?))
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The content of the string starting at `i` (raw, escapes kept) and the index after it.
fn string(bytes: &[u8], i: usize) -> Option<(&[u8], usize)> {
    if bytes.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'"' => return Some((&bytes[i + 1..j], j + 1)),
            _ => j += 1,
        }
    }
    None
}

/// The index just after the value starting at `i`.
fn skip_value(bytes: &[u8], i: usize) -> Option<usize> {
    match bytes.get(i)? {
        b'"' => Some(string(bytes, i)?.1),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < bytes.len() {
                match bytes[j] {
                    b'"' => {
                        j = string(bytes, j)?.1;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < bytes.len() && !matches!(bytes[j], b',' | b'}' | b']') {
                j += 1;
            }
            Some(j)
        }
    }
}

/// The elements of the array starting at `i`, and the index after it.
fn elements(bytes: &[u8], i: usize) -> Option<(Vec<&[u8]>, usize)> {
    if bytes.get(i) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    let mut j = skip_ws(bytes, i + 1);
    if bytes.get(j) == Some(&b']') {
        return Some((out, j + 1));
    }
    loop {
        let end = skip_value(bytes, j)?;
        out.push(&bytes[j..end]);
        j = skip_ws(bytes, end);
        match bytes.get(j)? {
            b',' => j = skip_ws(bytes, j + 1),
            b']' => return Some((out, j + 1)),
            _ => return None,
        }
    }
}

/// Parses every item with `parse` on up to `threads` threads, in order; `None` when any fails.
pub(super) fn parse_all<T: Send>(
    items: &[&[u8]],
    threads: usize,
    parse: impl Fn(&[u8]) -> Option<T> + Sync,
) -> Option<Vec<T>> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.iter().map(|item| parse(item)).collect();
    }
    // Contiguous chunks of about equal size in bytes.
    let total: usize = items.iter().map(|i| i.len()).sum();
    let per = total.div_ceil(threads);
    let mut chunks: Vec<&[&[u8]]> = Vec::with_capacity(threads);
    let (mut start, mut size) = (0, 0);
    for (k, item) in items.iter().enumerate() {
        size += item.len();
        if size >= per && chunks.len() + 1 < threads {
            chunks.push(&items[start..=k]);
            (start, size) = (k + 1, 0);
        }
    }
    chunks.push(&items[start..]);
    let parse = &parse;
    let parsed: Vec<Option<Vec<T>>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| s.spawn(move || chunk.iter().map(|item| parse(item)).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let mut out = Vec::with_capacity(items.len());
    for chunk in parsed {
        out.extend(chunk?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_splits_into_its_items_whatever_their_strings_hold() {
        let text =
            br#" {"apiVersion": "v1", "items": [ {"a": "x}],{\"y"}, {"b": [1, {"c": null}]} ,
            {"d": "\\"} ], "kind": "List", "metadata": {"resourceVersion": ""}} "#;
        let (kind, items) = list(text).unwrap();
        assert_eq!(kind, "List");
        let items: Vec<&str> = items
            .iter()
            .map(|i| std::str::from_utf8(i).unwrap())
            .collect();
        assert_eq!(
            items,
            [
                r#"{"a": "x}],{\"y"}"#,
                r#"{"b": [1, {"c": null}]}"#,
                r#"{"d": "\\"}"#
            ]
        );
        for item in &items {
            serde_json::from_str::<serde_json::Value>(item).expect("each item is whole JSON");
        }
    }

    #[test]
    fn what_it_does_not_understand_is_refused() {
        for bad in [
            &b"[1, 2]"[..],
            b"{\"items\": [1, 2}",
            b"{\"items\": [1], \"kind\": \"List\"} trailing",
            b"{\"kind\": \"List\"}",
            b"{\"items\": [\"unterminated]}",
        ] {
            assert!(list(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn items_parsed_on_several_threads_keep_their_order() {
        let items: Vec<String> = (0..101).map(|i| format!("{{\"n\": {i}}}")).collect();
        let bytes: Vec<&[u8]> = items.iter().map(|s| s.as_bytes()).collect();
        let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
        let got = parse_all(&bytes, 3, parse).unwrap();
        let numbers: Vec<u64> = got.iter().map(|v| v["n"].as_u64().unwrap()).collect();
        assert_eq!(numbers, (0..101).collect::<Vec<u64>>());
        let mut broken = bytes.clone();
        broken[50] = b"{";
        assert!(parse_all(&broken, 3, parse).is_none());
    }
}
