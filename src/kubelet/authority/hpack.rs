//! An HPACK decoder (RFC 7541) for the rewriter: one connection's dynamic table, header
//! blocks decoded into a callback without an allocation per field.
//!
//! Why its own: the crate the rewriter used first rebuilt a hash map of the whole Huffman
//! code for every Huffman-coded string and then walked it one hashed lookup per bit. On a
//! kubelet's calls (grpc-go and h2 Huffman-code every literal) that was 45 % of the
//! instructions of a whole prepare call that finds no claim (counted under callgrind,
//! docs/architecture.md). Here the code is decoded from its canonical form: the RFC's
//! table is canonical (codes of one length are consecutive and follow those of the shorter
//! lengths), so the code lengths alone determine it, and a bit costs a compare.
//!
//! What it checks is what `h2` checks of the same bytes: indices within the two tables,
//! integers and strings within the block, Huffman padding (at most 7 bits, all ones, no
//! EOS), dynamic table size updates within the limit the server allows and only at the
//! start of a block (RFC 7541 §4.2), and not as the last thing in it.

use std::collections::VecDeque;

/// Why a header block cannot be decoded. The connection must end: the dynamic table may
/// no longer match the client's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// Index 0, or past the static table plus the current dynamic table.
    #[error("header index {index} is not in the table (static 1-61, dynamic {dynamic} entries)")]
    Index { index: usize, dynamic: usize },
    /// An integer's continuation bytes run past the block or past 2^28.
    #[error("integer at byte {at} is truncated or too large")]
    Integer { at: usize },
    /// A string's length runs past the end of the block.
    #[error("string at byte {at} is {len} bytes but the block ends first")]
    StringLength { at: usize, len: usize },
    /// Huffman code padded with more than 7 bits, with zero bits, or containing EOS.
    #[error("invalid Huffman code in the string at byte {at}")]
    Huffman { at: usize },
    /// A dynamic table size update above what the server allows.
    #[error("dynamic table size update to {size} bytes, above the allowed {allowed}")]
    TableSize { size: usize, allowed: usize },
    /// A dynamic table size update after a header field of the same block.
    #[error("dynamic table size update at byte {at}, after a header field")]
    LateSizeUpdate { at: usize },
    /// The block's last representation is a dynamic table size update.
    #[error("header block ends with a dynamic table size update")]
    SizeUpdateAtEnd,
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The bit length of each symbol's Huffman code, RFC 7541 Appendix B (symbols 0-255, then
/// EOS). The codes themselves follow from these: the table is a canonical Huffman code.
#[rustfmt::skip]
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
     6, 10, 10, 12, 13,  6,  8, 11, 10, 10,  8, 11,  8,  6,  6,  6,
     5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8, 15,  6, 12, 10,
    13,  6,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,
     7,  7,  7,  7,  7,  7,  7,  7,  8,  7,  8, 13, 19, 13, 14,  6,
    15,  5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,  6,  5,
     6,  7,  6,  5,  5,  6,  7,  7,  7,  7,  7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
];

const EOS: u16 = 256;
const LONGEST: usize = 30;

/// The canonical code, by length: codes of length `l` are `first_code[l]` up to
/// `first_code[l] + count[l]`, for the symbols `symbols[first_index[l]..][..count[l]]`.
struct Canonical {
    first_code: [u32; LONGEST + 1],
    count: [u32; LONGEST + 1],
    first_index: [u16; LONGEST + 1],
    symbols: [u16; 257],
    /// Each symbol's code (its length is in [`CODE_LENGTHS`]).
    codes: [u32; 257],
}

const CANONICAL: Canonical = canonical();

const fn canonical() -> Canonical {
    let mut c = Canonical {
        first_code: [0; LONGEST + 1],
        count: [0; LONGEST + 1],
        first_index: [0; LONGEST + 1],
        symbols: [0; 257],
        codes: [0; 257],
    };
    let mut code: u32 = 0;
    let mut index: usize = 0;
    let mut len = 1;
    while len <= LONGEST {
        c.first_code[len] = code;
        c.first_index[len] = index as u16;
        let mut symbol = 0;
        while symbol < 257 {
            if CODE_LENGTHS[symbol] as usize == len {
                c.symbols[index] = symbol as u16;
                c.codes[symbol] = code;
                index += 1;
                c.count[len] += 1;
                code += 1;
            }
            symbol += 1;
        }
        code <<= 1;
        len += 1;
    }
    c
}

/// Appends `s` as an HPACK string literal (RFC 7541 §5.2) the way grpc-go's and h2's
/// encoders write one: Huffman-coded when that makes it shorter, else raw. The rewriter
/// never writes it (it re-encodes strings raw); tests and the `authority` bench build real
/// clients' header blocks with it.
pub fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    let mut coded = Vec::new();
    huffman_encode(s, &mut coded);
    if coded.len() < s.len() {
        encode_integer(coded.len(), 7, 0x80, out);
        out.extend_from_slice(&coded);
    } else {
        encode_integer(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// Appends the Huffman coding of `input`, padded with the most significant bits of EOS, to
/// `out`.
fn huffman_encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0;
    for &byte in input {
        let len = usize::from(CODE_LENGTHS[usize::from(byte)]);
        acc = (acc << len) | u64::from(CANONICAL.codes[usize::from(byte)]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

/// Appends the Huffman decoding of `input` to `out`; `at` (the string's offset in the
/// block) only names it in the error.
fn huffman_decode(input: &[u8], at: usize, out: &mut Vec<u8>) -> Result<(), HpackError> {
    let c = &CANONICAL;
    let mut code: u32 = 0;
    let mut len: usize = 0;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let offset = code.wrapping_sub(c.first_code[len]);
            if offset < c.count[len] {
                let symbol = c.symbols[usize::from(c.first_index[len]) + offset as usize];
                if symbol == EOS {
                    return Err(HpackError::Huffman { at });
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            } else if len == LONGEST {
                // Every 30-bit pattern that is no code is a prefix of none either.
                return Err(HpackError::Huffman { at });
            }
        }
    }
    // Padding: the most significant bits of EOS (all ones), fewer than 8 of them.
    if len > 7 || code != (1 << len) - 1 {
        return Err(HpackError::Huffman { at });
    }
    Ok(())
}

/// Reads an integer with an `prefix`-bit prefix at `block[*pos..]` (RFC 7541 §5.1).
fn integer(block: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let at = *pos;
    let err = HpackError::Integer { at };
    let max = (1usize << prefix) - 1;
    let first = usize::from(*block.get(*pos).ok_or(err.clone())?) & max;
    *pos += 1;
    if first < max {
        return Ok(first);
    }
    let mut value = max;
    let mut shift = 0;
    loop {
        let byte = *block.get(*pos).ok_or(err.clone())?;
        *pos += 1;
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
        if shift > 21 {
            return Err(err);
        }
    }
}

/// Appends `value` as an integer with a `prefix`-bit prefix (RFC 7541 §5.1), the first
/// byte's other bits taken from `first`.
pub fn encode_integer(value: usize, prefix: u8, first: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// One connection's decoding state.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: entry 0 is index 62.
    table: VecDeque<Entry>,
    /// The table's size as RFC 7541 §4.1 counts it (32 bytes more per entry).
    size: usize,
    /// The size the client last set (starts at `allowed`).
    max: usize,
    /// The most the server allows (SETTINGS_HEADER_TABLE_SIZE).
    allowed: usize,
    name: Vec<u8>,
    value: Vec<u8>,
}

/// A string of the block: where it is, and whether it is Huffman-coded.
#[derive(Clone, Copy)]
struct Str {
    start: usize,
    len: usize,
    huffman: bool,
}

impl Decoder {
    /// A decoder for a connection whose server allows a dynamic table of `allowed` bytes.
    pub fn new(allowed: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max: allowed,
            allowed,
            name: Vec::new(),
            value: Vec::new(),
        }
    }

    /// Decodes one whole header block, calling `field(name, value)` for each header field
    /// in order, and updates the dynamic table as the block says.
    ///
    /// # Errors
    /// [`HpackError`] at the first representation that is malformed; the fields before it
    /// have been passed to `field`, and the table may hold their additions.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut seen_field = false;
        let mut last_was_size_update = false;
        while pos < block.len() {
            let at = pos;
            let first = block[pos];
            last_was_size_update = false;
            if first & 0x80 != 0 {
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.entry(index)?;
                field(name, value);
                seen_field = true;
            } else if first & 0xe0 == 0x20 {
                if seen_field {
                    return Err(HpackError::LateSizeUpdate { at });
                }
                let size = integer(block, &mut pos, 5)?;
                if size > self.allowed {
                    return Err(HpackError::TableSize {
                        size,
                        allowed: self.allowed,
                    });
                }
                self.max = size;
                self.evict_to(size);
                last_was_size_update = true;
            } else {
                // Literals: 01 (incremental indexing, 6-bit index), 0000 (without
                // indexing) and 0001 (never indexed), both with a 4-bit index.
                let indexing = first & 0x40 != 0;
                let index = integer(block, &mut pos, if indexing { 6 } else { 4 })?;
                // The scratch buffers are taken out so the table can be read and then
                // grown while they hold the field.
                let mut name = std::mem::take(&mut self.name);
                let mut value = std::mem::take(&mut self.value);
                let read = self.literal(block, &mut pos, index, &mut name, &mut value);
                if read.is_ok() {
                    field(&name, &value);
                    if indexing {
                        self.insert(&name, &value);
                    }
                }
                self.name = name;
                self.value = value;
                read?;
                seen_field = true;
            }
        }
        if last_was_size_update {
            return Err(HpackError::SizeUpdateAtEnd);
        }
        Ok(())
    }

    /// Reads a literal's name (`index` 0: a string of the block, else the table entry's
    /// name) and value into `name` and `value`, from `block[*pos..]`.
    fn literal(
        &self,
        block: &[u8],
        pos: &mut usize,
        index: usize,
        name: &mut Vec<u8>,
        value: &mut Vec<u8>,
    ) -> Result<(), HpackError> {
        name.clear();
        value.clear();
        if index == 0 {
            let s = string_at(block, pos)?;
            take(block, s, name)?;
        } else {
            name.extend_from_slice(self.entry(index)?.0);
        }
        let s = string_at(block, pos)?;
        take(block, s, value)
    }

    /// Entries in the dynamic table now.
    #[cfg(test)]
    fn dynamic_len(&self) -> usize {
        self.table.len()
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        let missing = HpackError::Index {
            index,
            dynamic: self.table.len(),
        };
        match index {
            0 => Err(missing),
            1..=61 => Ok(STATIC_TABLE[index - 1]),
            _ => self
                .table
                .get(index - 62)
                .map(|(n, v)| (&n[..], &v[..]))
                .ok_or(missing),
        }
    }

    /// Adds an entry as RFC 7541 §4.4 says: older entries are evicted to make room, and an
    /// entry larger than the whole table empties it and is not added.
    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max - size);
        self.table.push_front((name.into(), value.into()));
        self.size += size;
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some((n, v)) = self.table.pop_back() else {
                self.size = 0;
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }
}

/// Reads a string's header (H bit and length) and checks the block holds it.
fn string_at(block: &[u8], pos: &mut usize) -> Result<Str, HpackError> {
    let at = *pos;
    let huffman = block.get(at).is_some_and(|b| b & 0x80 != 0);
    let len = integer(block, pos, 7)?;
    let start = *pos;
    if block.len() - start < len {
        return Err(HpackError::StringLength { at, len });
    }
    *pos += len;
    Ok(Str {
        start,
        len,
        huffman,
    })
}

fn take(block: &[u8], s: Str, out: &mut Vec<u8>) -> Result<(), HpackError> {
    let bytes = &block[s.start..s.start + s.len];
    if s.huffman {
        huffman_decode(bytes, s.start, out)
    } else {
        out.extend_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
#[path = "hpack_tests.rs"]
mod tests;
