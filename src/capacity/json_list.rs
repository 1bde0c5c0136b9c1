//! Reading the `items` of a large JSON `List` object (`kubectl get … -o json`) on two cores.
//!
//! The object is walked key by key and item by item, each item parsed by `serde_json`, so the
//! result is exactly a sequential parse's. To use the second core, a worker starts at a
//! likely boundary between two items in the middle of the bytes and parses from there to the
//! end, while the caller's thread parses from the start. A boundary is a `,` between `}` and
//! `{` where an item parses and is followed by `,` or `]`: most such commas in a slice list
//! lie between two devices of one slice, which do not parse as a slice. The boundary is still
//! only a guess (it may lie between nested objects that happen to parse, or inside a string
//! that holds `},{`), so the worker's items are taken only when the caller's thread, parsing
//! item after item, lands exactly on that comma after a whole item of the list. Otherwise the
//! caller's thread parses the rest itself and the worker's result is dropped.

use serde::Deserialize;
use serde::de::IgnoredAny;

/// Below this size a list is parsed on one thread: a second one costs more than it saves.
const SPLIT_MIN_BYTES: usize = 4 << 20;

/// How many commas [`split_point`] tries before parsing on one thread.
const SPLIT_CANDIDATES: usize = 10_000;

/// The top-level `kind` and `apiVersion` of a list, when present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Head<'a> {
    pub(super) kind: Option<&'a str>,
    pub(super) api_version: Option<&'a str>,
}

impl<'a> Head<'a> {
    fn or(self, other: Head<'a>) -> Head<'a> {
        Head {
            kind: self.kind.or(other.kind),
            api_version: self.api_version.or(other.api_version),
        }
    }

    /// Records a top-level `kind` or `apiVersion`; `false` for other keys.
    fn take(&mut self, key: &str, walk: &mut Walk<'a>) -> Option<bool> {
        match key {
            "kind" => self.kind = Some(walk.value()?),
            "apiVersion" => self.api_version = Some(walk.value()?),
            _ => return Some(false),
        }
        Some(true)
    }
}

/// The head and `items` of a JSON object; `None` when the bytes are not one JSON object
/// with an `items` array whose elements all parse as `T`, or when a key, `kind` or
/// `apiVersion` holds an escape (strings are borrowed from the bytes).
pub(super) fn parse<'a, T>(bytes: &'a [u8]) -> Option<(Head<'a>, Vec<T>)>
where
    T: Deserialize<'a> + Send,
{
    let split = (bytes.len() >= SPLIT_MIN_BYTES)
        .then(|| split_point::<T>(bytes, bytes.len() / 2))
        .flatten();
    parse_split(bytes, split)
}

/// The first comma at or after `from` between a `}` and a `{` after which a `T` parses and is
/// followed by `,` or `]`, as the next item of a list would be.
pub(super) fn split_point<'a, T: Deserialize<'a>>(bytes: &'a [u8], from: usize) -> Option<usize> {
    let mut from = from;
    for _ in 0..SPLIT_CANDIDATES {
        let comma = boundary_after(bytes, from)?;
        let mut walk = Walk::new(bytes, None);
        walk.pos = comma + 1;
        if walk.value::<T>().is_some() && matches!(walk.next_byte(), Some(b',' | b']')) {
            return Some(comma);
        }
        from = comma + 1;
    }
    None
}

/// [`parse`] with the worker starting after the comma at `split` (tests choose it).
pub(super) fn parse_split<'a, T>(
    bytes: &'a [u8],
    split: Option<usize>,
) -> Option<(Head<'a>, Vec<T>)>
where
    T: Deserialize<'a> + Send,
{
    let Some(comma) = split else {
        return Walk::new(bytes, None).object();
    };
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("capacity-parse".into())
            .spawn_scoped(scope, move || {
                let mut walk = Walk::new(bytes, None);
                walk.pos = comma + 1;
                let items = walk.items_after_first()?;
                let head = walk.rest_of_object()?;
                Some((head, items))
            });
        let Ok(worker) = worker else {
            // No second thread to be had: one does it all.
            return Walk::new(bytes, None).object();
        };
        let mut walk = Walk::new(bytes, Some(comma));
        let mut result = walk.object();
        if walk.stopped_at_split {
            // Everything after the comma is the worker's: the rest of the items and of the
            // object. Its error is the document's.
            result = match (result, worker.join().ok().flatten()) {
                (Some((head_before, mut items)), Some((head_after, rest))) => {
                    items.extend(rest);
                    Some((head_after.or(head_before), items))
                }
                _ => None,
            };
        }
        result
    })
}

/// The first comma at or after `from` that sits between a `}` and a `{` (whitespace
/// allowed): where one object of an array ends and the next begins, unless it is inside a
/// string or a nested array, which the walk rules out later.
fn boundary_after(bytes: &[u8], from: usize) -> Option<usize> {
    let is_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut at = from;
    while let Some(offset) = bytes.get(at..)?.iter().position(|&b| b == b',') {
        let comma = at + offset;
        let before = bytes[..comma].iter().rev().find(|b| !is_ws(b));
        let after = bytes[comma + 1..].iter().find(|b| !is_ws(b));
        if before == Some(&b'}') && after == Some(&b'{') {
            return Some(comma);
        }
        at = comma + 1;
    }
    None
}

/// A cursor over the bytes, parsing one JSON value at a time.
struct Walk<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Stop the items here (the worker's start) if an item ends exactly at it.
    split: Option<usize>,
    stopped_at_split: bool,
}

impl<'a> Walk<'a> {
    fn new(bytes: &'a [u8], split: Option<usize>) -> Self {
        Walk {
            bytes,
            pos: 0,
            split,
            stopped_at_split: false,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next non-blank byte, consumed.
    fn next_byte(&mut self) -> Option<u8> {
        self.skip_ws();
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn expect(&mut self, want: u8) -> Option<()> {
        (self.next_byte()? == want).then_some(())
    }

    /// One JSON value at the cursor, as `T`.
    fn value<T: Deserialize<'a>>(&mut self) -> Option<T> {
        let mut stream = serde_json::Deserializer::from_slice(&self.bytes[self.pos..]).into_iter();
        let value = stream.next()?.ok()?;
        self.pos += stream.byte_offset();
        Some(value)
    }

    /// The whole document: one object, then nothing but whitespace.
    fn object<T: Deserialize<'a>>(&mut self) -> Option<(Head<'a>, Vec<T>)> {
        self.expect(b'{')?;
        let mut head = Head::default();
        let mut items = None;
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
        } else {
            loop {
                self.skip_ws();
                let key: &'a str = self.value()?;
                self.expect(b':')?;
                match key {
                    "items" => {
                        items = Some(self.items()?);
                        if self.stopped_at_split {
                            return Some((head, items.unwrap_or_default()));
                        }
                    }
                    _ => {
                        if !head.take(key, self)? {
                            self.value::<IgnoredAny>()?;
                        }
                    }
                }
                match self.next_byte()? {
                    b',' => continue,
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        self.skip_ws();
        (self.pos == self.bytes.len()).then_some((head, items?))
    }

    /// An array of `T`, stopping early (with `stopped_at_split`) when an item ends right
    /// before the split comma.
    fn items<T: Deserialize<'a>>(&mut self) -> Option<Vec<T>> {
        self.expect(b'[')?;
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Some(Vec::new());
        }
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            items.push(self.value()?);
            self.skip_ws();
            if Some(self.pos) == self.split {
                self.stopped_at_split = true;
                return Some(items);
            }
            match self.next_byte()? {
                b',' => continue,
                b']' => return Some(items),
                _ => return None,
            }
        }
    }

    /// The worker's part of the array: items up to and including its closing `]`.
    fn items_after_first<T: Deserialize<'a>>(&mut self) -> Option<Vec<T>> {
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            items.push(self.value()?);
            match self.next_byte()? {
                b',' => continue,
                b']' => return Some(items),
                _ => return None,
            }
        }
    }

    /// After the items' `]`: the object's remaining keys, its `}` and the end of the bytes.
    /// Answers the `kind` and `apiVersion` that come after the items.
    fn rest_of_object(&mut self) -> Option<Head<'a>> {
        let mut head = Head::default();
        loop {
            match self.next_byte()? {
                b'}' => break,
                b',' => {
                    self.skip_ws();
                    let key: &'a str = self.value()?;
                    self.expect(b':')?;
                    // A second `items` would make the worker's items not the last ones.
                    if key == "items" {
                        return None;
                    }
                    if !head.take(key, self)? {
                        self.value::<IgnoredAny>()?;
                    }
                }
                _ => return None,
            }
        }
        self.skip_ws();
        (self.pos == self.bytes.len()).then_some(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn document(pretty: bool) -> String {
        let items: Vec<Value> = (0..40)
            .map(|i| {
                json!({"name": format!("item-{i}"),
                       "nested": [{"a": 1}, {"b": "},{"}, {"c": [{}, {}]}],
                       "text": "x},{y"})
            })
            .collect();
        let list = json!({"apiVersion": "v1", "items": items, "kind": "List",
                          "metadata": {"resourceVersion": ""}});
        if pretty {
            serde_json::to_string_pretty(&list).unwrap()
        } else {
            list.to_string()
        }
    }

    fn names(parsed: Option<(Head, Vec<Value>)>) -> (Head, Vec<String>) {
        let (head, items) = parsed.expect("parses");
        (
            head,
            items
                .iter()
                .map(|v| v["name"].as_str().unwrap().to_string())
                .collect(),
        )
    }

    #[test]
    fn every_split_point_gives_the_sequential_result() {
        for pretty in [false, true] {
            let text = document(pretty);
            let bytes = text.as_bytes();
            let sequential = names(parse_split::<Value>(bytes, None));
            assert_eq!(sequential.1.len(), 40);
            assert_eq!(
                sequential.0,
                Head {
                    kind: Some("List"),
                    api_version: Some("v1")
                }
            );
            // Every comma in the document, including those inside nested arrays and strings.
            let commas: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] == b',').collect();
            assert!(commas.len() > 200);
            for comma in commas {
                assert_eq!(
                    names(parse_split::<Value>(bytes, Some(comma))),
                    sequential,
                    "split at byte {comma} (pretty: {pretty})"
                );
            }
        }
    }

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Named<'a> {
        name: &'a str,
        text: &'a str,
    }

    #[test]
    fn the_split_point_is_where_an_item_of_the_list_parses() {
        let text = document(false);
        let bytes = text.as_bytes();
        // From an item's `nested` key, the first `},{` is inside its nested array...
        let from = text.len() / 2 + text[text.len() / 2..].find(r#""nested""#).unwrap();
        let naive = boundary_after(bytes, from).unwrap();
        assert!(
            text[naive + 1..].starts_with(r#"{"b""#),
            "{}",
            &text[naive..]
        );
        // ...the split point is the next item's start, and parsing from it agrees.
        let comma = split_point::<Named>(bytes, from).unwrap();
        assert!(
            text[comma + 1..].starts_with(r#"{"name":"item-"#),
            "{}",
            &text[comma..]
        );
        assert_eq!(
            parse_split::<Named>(bytes, Some(comma)).map(|(h, items)| (h, items.len())),
            parse_split::<Named>(bytes, None).map(|(h, items)| (h, items.len()))
        );
        assert!(split_point::<Named>(b"[1,2,3]", 0).is_none());
    }

    #[test]
    fn the_guessed_boundary_is_between_two_objects() {
        let text = document(false);
        let comma = boundary_after(text.as_bytes(), text.len() / 2).unwrap();
        assert_eq!(&text[comma - 1..comma + 2], "},{");
        assert!(boundary_after(b"[1,2,3]", 0).is_none());
    }

    #[test]
    fn a_broken_document_fails_whichever_thread_meets_the_fault() {
        let text = document(false);
        let bytes = text.as_bytes();
        let middle = boundary_after(bytes, text.len() / 2).unwrap();
        // A fault before the split (caller's part), after it (worker's part), and at the end.
        let early = text.replacen("item-1\"", "item-1\"\"", 1);
        let late = text.replacen("item-38\"", "item-38\"\"", 1);
        let trailing = format!("{text} {{}}");
        let truncated = &text[..text.len() - 1];
        for broken in [early.as_str(), late.as_str(), trailing.as_str(), truncated] {
            let at = boundary_after(broken.as_bytes(), middle.min(broken.len() / 2));
            assert!(parse_split::<Value>(broken.as_bytes(), at).is_none());
            assert!(parse_split::<Value>(broken.as_bytes(), None).is_none());
        }
    }

    #[test]
    fn a_second_items_key_or_a_wrong_item_type_is_refused() {
        let twice = r#"{"items": [{"a": 1}, {"a": 2}], "items": [{"a": 3}]}"#;
        let comma = twice.find("}, {").unwrap() + 1;
        assert!(parse_split::<Value>(twice.as_bytes(), Some(comma)).is_none());
        assert!(parse_split::<u32>(br#"{"items": [1, "two"]}"#, None).is_none());
        // A key given twice, before and after the items: the later wins, split or not.
        let kinds = r#"{"kind": "A", "items": [{"a": 1}, {"a": 2}], "kind": "B"}"#;
        let comma = kinds.find("}, {").unwrap() + 1;
        for split in [None, Some(comma)] {
            let (head, items) = parse_split::<Value>(kinds.as_bytes(), split).unwrap();
            assert_eq!((head.kind, items.len()), (Some("B"), 2), "split {split:?}");
        }
        assert_eq!(
            parse_split::<u32>(br#"{"items": []}"#, None).unwrap().1,
            Vec::<u32>::new()
        );
    }
}
