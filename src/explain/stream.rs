//! Reading a large JSON list — `kubectl get … -o json`, or the API server's list response —
//! item by item as its bytes arrive, so that a 1,000-node cluster's ResourceSlices (120 to
//! 900 MB of JSON) are never held at once.
//!
//! [`ListSplitter`] takes the bytes in pieces of any size and hands out each element of the
//! top-level object's `items` array as soon as its closing brace arrives, with the blanks
//! between tokens removed (an indented file's items come out at a quarter of their size).
//! Everything outside `items` (the list's `apiVersion`, `kind`, `metadata`) is kept, small, and
//! parsed at the end ([`ListSplitter::finish`]). The splitter follows strings, escapes and
//! nesting, but does not validate an item: whoever parses the item does.
//!
//! [`read_file`] runs the splitter on a second thread while the caller's thread uses the
//! items; [`read_list`] feeds it an API server's list response as the body arrives.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The list's own `kind` and `apiVersion`, when it has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListHead {
    /// `List` (kubectl) or `<Kind>List` (the API server's typed list).
    pub kind: Option<String>,
    /// `v1` (kubectl) or the items' group version (the API server's typed list).
    pub api_version: Option<String>,
}

impl ListHead {
    /// Whether this is the API server's typed list of `kind` objects of `api_version`
    /// (`ResourceSliceList` of `resource.k8s.io/v1`), whose items carry neither field.
    pub fn is_typed_list_of(&self, kind: &str, api_version: &str) -> bool {
        self.kind
            .as_deref()
            .and_then(|k| k.strip_suffix("List"))
            .is_some_and(|k| k == kind)
            && self.api_version.as_deref() == Some(api_version)
    }
}

/// The bytes are not one JSON object whose `items` is an array of objects.
#[derive(Debug, thiserror::Error)]
#[error("not a JSON list object: {problem} at byte {offset}")]
pub struct ShapeError {
    /// What was wrong.
    pub problem: &'static str,
    /// Where, counted from the first byte fed.
    pub offset: u64,
}

/// Where the splitter is in the document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// Before the top-level `{`.
    Start,
    /// In the top-level object, outside `items`, `depth` levels deep (1: its own keys).
    Top,
    /// After the `items` key's colon, before its `[`.
    ItemsValue,
    /// In the `items` array, between elements.
    Items,
    /// In one element, `depth` levels deep (1: its own keys).
    Item,
    /// After the top-level `}`.
    End,
}

/// What a byte is to the splitter outside strings.
const PLAIN: u8 = 0;
const BLANK: u8 = 1;
const QUOTE: u8 = 2;
const OPEN: u8 = 3;
const CLOSE: u8 = 4;

const CLASS: [u8; 256] = {
    let mut class = [PLAIN; 256];
    class[b' ' as usize] = BLANK;
    class[b'\t' as usize] = BLANK;
    class[b'\n' as usize] = BLANK;
    class[b'\r' as usize] = BLANK;
    class[b'"' as usize] = QUOTE;
    class[b'{' as usize] = OPEN;
    class[b'[' as usize] = OPEN;
    class[b'}' as usize] = CLOSE;
    class[b']' as usize] = CLOSE;
    class
};

/// Splits one JSON list object into its items as bytes are fed; see the module docs.
#[derive(Debug)]
pub struct ListSplitter {
    at: At,
    depth: usize,
    /// Inside a string; `escaped`: right after its backslash.
    in_string: bool,
    escaped: bool,
    /// In [`At::Items`]: an element must come next (after `[` or a comma).
    want_element: bool,
    /// In [`At::Items`]: no element yet, so `]` may close the array at once.
    no_element: bool,
    /// The document outside `items` (with `items` as `[]`), blanks removed.
    skeleton: Vec<u8>,
    /// Where the last string of the top-level object's own level began in `skeleton`.
    key_start: usize,
    /// `items` was seen.
    had_items: bool,
    /// The element being read, blanks removed.
    item: Vec<u8>,
    /// Bytes fed so far.
    offset: u64,
}

impl Default for ListSplitter {
    fn default() -> Self {
        Self::new()
    }
}

impl ListSplitter {
    /// A splitter before the first byte.
    pub fn new() -> Self {
        ListSplitter {
            at: At::Start,
            depth: 0,
            in_string: false,
            escaped: false,
            want_element: true,
            no_element: true,
            skeleton: Vec::new(),
            key_start: 0,
            had_items: false,
            item: Vec::new(),
            offset: 0,
        }
    }

    fn shape(&self, problem: &'static str, at: usize) -> ShapeError {
        ShapeError {
            problem,
            offset: self.offset + at as u64,
        }
    }

    /// Feeds the next bytes; every element of `items` completed by them is pushed on `out`,
    /// in document order.
    ///
    /// Fails when the bytes cannot be a JSON object with an `items` array of objects: another
    /// first byte than `{`, an element that is not an object, two `items` keys, anything after
    /// the object but blanks.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), ShapeError> {
        let mut i = 0;
        while i < bytes.len() {
            i = match self.at {
                At::Item => self.item_bytes(bytes, i, out),
                At::Top => self.top_bytes(bytes, i)?,
                At::Start | At::ItemsValue | At::Items | At::End => {
                    let b = bytes[i];
                    if CLASS[b as usize] == BLANK {
                        i + 1
                    } else {
                        self.structural(b, i)?;
                        i + 1
                    }
                }
            };
        }
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// A non-blank byte outside the top-level object's keys and outside elements.
    fn structural(&mut self, b: u8, i: usize) -> Result<(), ShapeError> {
        match (self.at, b) {
            (At::Start, b'{') => {
                self.skeleton.push(b'{');
                self.at = At::Top;
                self.depth = 1;
            }
            (At::Start, _) => return Err(self.shape("the document does not start with {", i)),
            (At::ItemsValue, b'[') => {
                self.skeleton.extend_from_slice(b"[]");
                self.at = At::Items;
                self.want_element = true;
                self.no_element = true;
            }
            (At::ItemsValue, _) => return Err(self.shape("items is not an array", i)),
            (At::Items, b'{') if self.want_element => {
                self.item.push(b'{');
                self.at = At::Item;
                self.depth = 1;
            }
            (At::Items, b',') if !self.want_element => self.want_element = true,
            (At::Items, b']') if !self.want_element || self.no_element => {
                self.at = At::Top;
                self.depth = 1;
            }
            (At::Items, _) => {
                return Err(self.shape("an element of items is not an object", i));
            }
            (At::End, _) => return Err(self.shape("something follows the list object", i)),
            (At::Top | At::Item, _) => unreachable!("handled by their own loops"),
        }
        Ok(())
    }

    /// Bytes of one element, from `i`; answers where it stopped (the end of the bytes, or just
    /// after the element's closing brace).
    fn item_bytes(&mut self, bytes: &[u8], mut i: usize, out: &mut Vec<Vec<u8>>) -> usize {
        let n = bytes.len();
        while i < n {
            if self.in_string {
                i = string_bytes(
                    bytes,
                    i,
                    &mut self.item,
                    &mut self.in_string,
                    &mut self.escaped,
                );
                continue;
            }
            let b = bytes[i];
            match CLASS[b as usize] {
                BLANK => {
                    i += 1;
                    while i < n && CLASS[bytes[i] as usize] == BLANK {
                        i += 1;
                    }
                }
                PLAIN => {
                    let start = i;
                    i += 1;
                    while i < n && CLASS[bytes[i] as usize] == PLAIN {
                        i += 1;
                    }
                    self.item.extend_from_slice(&bytes[start..i]);
                }
                QUOTE => {
                    self.item.push(b'"');
                    self.in_string = true;
                    i += 1;
                }
                OPEN => {
                    self.item.push(b);
                    self.depth += 1;
                    i += 1;
                }
                _ => {
                    self.item.push(b);
                    self.depth -= 1;
                    i += 1;
                    if self.depth == 0 {
                        let size = self.item.len();
                        out.push(std::mem::replace(&mut self.item, Vec::with_capacity(size)));
                        self.at = At::Items;
                        self.want_element = false;
                        self.no_element = false;
                        return i;
                    }
                }
            }
        }
        i
    }

    /// Bytes of the top-level object outside `items`, from `i`, into the skeleton.
    fn top_bytes(&mut self, bytes: &[u8], mut i: usize) -> Result<usize, ShapeError> {
        let n = bytes.len();
        while i < n {
            if self.in_string {
                i = string_bytes(
                    bytes,
                    i,
                    &mut self.skeleton,
                    &mut self.in_string,
                    &mut self.escaped,
                );
                continue;
            }
            let b = bytes[i];
            i += 1;
            match CLASS[b as usize] {
                BLANK => {}
                QUOTE => {
                    if self.depth == 1 {
                        self.key_start = self.skeleton.len();
                    }
                    self.skeleton.push(b'"');
                    self.in_string = true;
                }
                OPEN => {
                    self.skeleton.push(b);
                    self.depth += 1;
                }
                CLOSE => {
                    self.skeleton.push(b);
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.at = At::End;
                        return Ok(i);
                    }
                }
                _ => {
                    self.skeleton.push(b);
                    if b == b':' && self.depth == 1 && self.last_key_is_items() {
                        if self.had_items {
                            return Err(self.shape("the object has two items keys", i - 1));
                        }
                        self.had_items = true;
                        self.at = At::ItemsValue;
                        return Ok(i);
                    }
                }
            }
        }
        Ok(i)
    }

    /// Whether the skeleton ends with the key `"items"` and its colon.
    fn last_key_is_items(&self) -> bool {
        &self.skeleton[self.key_start..] == b"\"items\":"
    }

    /// After the last byte: the list's `kind` and `apiVersion`.
    ///
    /// Fails when the document is incomplete, has no `items`, or what surrounds the items is
    /// not valid JSON.
    pub fn finish(self) -> Result<ListHead, ShapeError> {
        if self.at != At::End {
            return Err(self.shape("the document ends inside the list object", 0));
        }
        if !self.had_items {
            return Err(self.shape("the object has no items", 0));
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Head {
            #[serde(default)]
            kind: Option<String>,
            #[serde(default)]
            api_version: Option<String>,
        }
        let head: Head = serde_json::from_slice(&self.skeleton)
            .map_err(|_| self.shape("the list object around the items is not valid JSON", 0))?;
        Ok(ListHead {
            kind: head.kind,
            api_version: head.api_version,
        })
    }
}

/// Copies string bytes from `i` up to and including the closing quote (or to the end of the
/// bytes), escapes included; answers where it stopped.
fn string_bytes(
    bytes: &[u8],
    mut i: usize,
    out: &mut Vec<u8>,
    in_string: &mut bool,
    escaped: &mut bool,
) -> usize {
    let n = bytes.len();
    if *escaped {
        out.push(bytes[i]);
        *escaped = false;
        i += 1;
    }
    let start = i;
    while i < n {
        match bytes[i] {
            b'"' => {
                out.extend_from_slice(&bytes[start..=i]);
                *in_string = false;
                return i + 1;
            }
            b'\\' => {
                if i + 1 < n {
                    i += 2;
                } else {
                    out.extend_from_slice(&bytes[start..=i]);
                    *escaped = true;
                    return n;
                }
            }
            _ => i += 1,
        }
    }
    out.extend_from_slice(&bytes[start..n.max(start)]);
    n
}

/// Reading a list file failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not one JSON list object (it may be YAML, or another form the general
    /// reader takes).
    #[error("{path}")]
    Shape {
        path: PathBuf,
        #[source]
        source: ShapeError,
    },
}

/// How many bytes [`read_file`] reads at a time.
const CHUNK: usize = 1 << 20;

/// How many items may wait between the reading thread and the caller.
const QUEUE: usize = 16;

/// Reads the JSON list object in `path` on a second thread, splitting it into items, and runs
/// `consume` on this thread over the items as they come; answers `consume`'s result and the
/// list's head. At most a few items wait in between, so memory holds the items `consume`
/// keeps, not the file.
///
/// `consume` may stop early (return without draining the items): the reading thread then
/// stops too, and the file's head is not checked ([`FileError`] only reports reading
/// failures in that case). Fails when the file cannot be read or is not a JSON list object.
pub fn read_file<R>(
    path: &Path,
    consume: impl FnOnce(&mut dyn Iterator<Item = Vec<u8>>) -> R,
) -> Result<(R, Option<ListHead>), FileError> {
    let read_error = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_error)?;
    std::thread::scope(|scope| {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Vec<u8>>(QUEUE);
        let reader = std::thread::Builder::new()
            .name("list-read".into())
            .spawn_scoped(scope, move || -> Result<Option<ListHead>, FileError> {
                let mut splitter = ListSplitter::new();
                let mut chunk = vec![0u8; CHUNK];
                let mut items = Vec::new();
                loop {
                    let n = match file.read(&mut chunk) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(read_error(e)),
                    };
                    splitter
                        .feed(&chunk[..n], &mut items)
                        .map_err(|source| FileError::Shape {
                            path: path.to_path_buf(),
                            source,
                        })?;
                    for item in items.drain(..) {
                        if sender.send(item).is_err() {
                            // The caller stopped listening.
                            return Ok(None);
                        }
                    }
                }
                drop(sender);
                splitter
                    .finish()
                    .map(Some)
                    .map_err(|source| FileError::Shape {
                        path: path.to_path_buf(),
                        source,
                    })
            })
            .map_err(read_error)?;
        let result = consume(&mut receiver.iter());
        drop(receiver);
        let head = reader.join().unwrap_or_else(|_| {
            Err(read_error(std::io::Error::other(
                "the reading thread panicked",
            )))
        })?;
        Ok((result, head))
    })
}

/// Whether the file at `path` looks like one JSON object (its first non-blank byte is `{`);
/// `false` for directories and unreadable files, which the general reader reports on.
pub fn is_json_object(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 4096];
    loop {
        let Ok(n) = file.read(&mut head) else {
            return false;
        };
        if n == 0 {
            return false;
        }
        if let Some(b) = head[..n].iter().find(|b| !b.is_ascii_whitespace()) {
            return *b == b'{';
        }
    }
}

/// Listing from the API server item by item failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The request failed or the API server answered with an error status.
    #[error("listing {what} from the API server")]
    Api {
        what: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    /// The response is not a list object.
    #[error("reading the API server's list of {what}")]
    Shape {
        what: &'static str,
        #[source]
        source: ShapeError,
    },
}

/// Lists `url` with `params` from the API server, feeding the response body to a
/// [`ListSplitter`] as it arrives and each item to `item`, on the calling task; answers the
/// list's head.
///
/// An error from `item` stops the listing (the rest of the body is dropped) and is returned.
/// Fails with [`ListError::Api`] when the request fails or the API server answers an error
/// status (its `Status`, as `kube::Error::Api`, as kube's own requests report it), and with
/// [`ListError::Shape`] when the body is not a list object.
pub async fn read_list<E: From<ListError>>(
    client: &kube::Client,
    what: &'static str,
    url: &str,
    params: &kube::api::ListParams,
    mut item: impl FnMut(Vec<u8>) -> Result<(), E>,
) -> Result<ListHead, E> {
    use http_body_util::BodyExt;
    let api = |source: kube::Error| ListError::Api {
        what,
        source: Box::new(source),
    };
    let shape = |source| ListError::Shape { what, source };
    let mut request = kube::core::Request::new(url)
        .list(params)
        .map_err(|e| api(kube::Error::BuildRequest(e)))?;
    request.extensions_mut().insert("list");
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .map_err(api)?;
    let status = response.status();
    let mut body = response.into_body();
    if status.is_client_error() || status.is_server_error() {
        let bytes = body.collect_bytes().await.map_err(api)?;
        return Err(api(error_status(status, &bytes)).into());
    }
    let mut splitter = ListSplitter::new();
    let mut items = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(api)?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        splitter.feed(data, &mut items).map_err(shape)?;
        for bytes in items.drain(..) {
            item(bytes)?;
        }
    }
    Ok(splitter.finish().map_err(shape)?)
}

/// An error response as kube's own requests report it: the API server's `Status`, or one made
/// from the code and text when the body is not a `Status` (a proxy's answer).
fn error_status(code: http::StatusCode, body: &[u8]) -> kube::Error {
    let status = serde_json::from_slice::<kube::core::Status>(body).unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(body);
        kube::core::Status::failure(text.trim(), "Failed to parse error data")
            .with_code(code.as_u16())
    });
    kube::Error::Api(status.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn document(pretty: bool) -> String {
        let items: Vec<Value> = (0..30)
            .map(|i| {
                json!({"name": format!("item-{i}"),
                       "nested": [{"a": 1}, {"b": "},{ \"quoted\" \\ [ ]"}, {"c": [{}, {}]}],
                       "text": "x},{y", "n": -1.5e3, "t": true, "z": null})
            })
            .collect();
        let list = json!({"apiVersion": "v1", "items": items, "kind": "List",
                          "metadata": {"resourceVersion": "", "odd": "items"}});
        if pretty {
            serde_json::to_string_pretty(&list).unwrap()
        } else {
            list.to_string()
        }
    }

    fn split(bytes: &[u8], piece: usize) -> Result<(Vec<Value>, ListHead), ShapeError> {
        let mut splitter = ListSplitter::new();
        let mut out = Vec::new();
        for chunk in bytes.chunks(piece.max(1)) {
            splitter.feed(chunk, &mut out)?;
        }
        let head = splitter.finish()?;
        let items = out
            .iter()
            .map(|b| serde_json::from_slice(b).expect("an item parses"))
            .collect();
        Ok((items, head))
    }

    #[test]
    fn every_piece_size_gives_the_items_a_whole_parse_gives() {
        for pretty in [false, true] {
            let text = document(pretty);
            let whole: Value = serde_json::from_str(&text).unwrap();
            for piece in [1, 2, 3, 7, 64, 1000, text.len()] {
                let (items, head) = split(text.as_bytes(), piece).unwrap();
                assert_eq!(
                    Value::Array(items),
                    whole["items"],
                    "pieces of {piece} bytes"
                );
                assert_eq!(head.kind.as_deref(), Some("List"));
                assert_eq!(head.api_version.as_deref(), Some("v1"));
            }
        }
    }

    #[test]
    fn items_come_out_without_the_blanks_between_tokens() {
        let text = document(true);
        let mut splitter = ListSplitter::new();
        let mut out = Vec::new();
        splitter.feed(text.as_bytes(), &mut out).unwrap();
        let first: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(out[0], serde_json::to_vec(&first["items"][0]).unwrap());
        assert!(out[0].len() * 2 < text.len() / 30);
    }

    #[test]
    fn the_api_servers_typed_list_names_its_items_kind_in_the_head() {
        let text = r#"{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"a"}}]}"#;
        let (items, head) = split(text.as_bytes(), 5).unwrap();
        assert_eq!(items.len(), 1);
        assert!(head.is_typed_list_of("ResourceSlice", "resource.k8s.io/v1"));
        assert!(!head.is_typed_list_of("ResourceClaim", "resource.k8s.io/v1"));
        let (items, head) = split(br#"{"items": []}"#, 1).unwrap();
        assert!(items.is_empty());
        assert_eq!(head, ListHead::default());
    }

    #[test]
    fn what_is_not_a_list_object_is_refused_naming_why() {
        let cases: [(&str, &str); 8] = [
            ("kind: List\nitems: []\n", "does not start with {"),
            (r#"{"items": {"a": 1}}"#, "items is not an array"),
            (r#"{"items": [1, 2]}"#, "not an object"),
            (r#"{"items": [{"a": 1} {"b": 2}]}"#, "not an object"),
            (r#"{"items": [{"a": 1}],}"#, "not valid JSON"),
            (r#"{"items": [], "items": []}"#, "two items keys"),
            (r#"{"items": [{"a": 1}]} {}"#, "follows the list object"),
            (r#"{"items": [{"a": 1}]"#, "ends inside"),
        ];
        for (text, problem) in cases {
            let error = split(text.as_bytes(), 3).expect_err(text);
            assert!(error.problem.contains(problem), "{text}: {error}");
        }
        let error = split(br#"{"kind": "List"}"#, 3).expect_err("no items");
        assert!(error.problem.contains("no items"), "{error}");
    }

    #[test]
    fn a_file_is_read_item_by_item_and_its_head_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.json");
        let text = document(true);
        std::fs::write(&path, &text).unwrap();
        assert!(is_json_object(&path));
        let (names, head) = read_file(&path, |items| {
            items
                .map(|b| {
                    let v: Value = serde_json::from_slice(&b).unwrap();
                    v["name"].as_str().unwrap().to_string()
                })
                .collect::<Vec<_>>()
        })
        .unwrap();
        assert_eq!(names.len(), 30);
        assert_eq!(names[29], "item-29");
        assert_eq!(head.unwrap().kind.as_deref(), Some("List"));
        // Stopping early stops the reader without an error.
        let (first, _) = read_file(&path, |items| items.next().map(|b| b.len())).unwrap();
        assert!(first.is_some());
        std::fs::write(&path, "kind: List\n").unwrap();
        assert!(!is_json_object(&path));
        assert!(matches!(
            read_file(&path, |items| items.count()),
            Err(FileError::Shape { .. })
        ));
        assert!(!is_json_object(dir.path()));
    }
}
