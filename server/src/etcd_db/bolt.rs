//! A read-only walker over bbolt's on-disk format (Go bbolt v1.3, as etcd 3.4–3.6 write it).
//!
//! Why not bbolt-rs: it refuses files whose meta page has no freelist (`PGID_NO_FREE_LIST
//! not currently supported`), and etcd opens bbolt with `NoFreelistSync`, so every etcd
//! database and snapshot is such a file. Reading needs far less than writing; this walker
//! reads pages with positional reads and holds one root-to-leaf path of pages at a time.
//!
//! Format (`bbolt@v1.3.10: page.go, db.go, bucket.go, node.go`; little-endian integers):
//! - the file is a sequence of pages of `page_size` bytes; page `n` starts at
//!   `n * page_size`. A page may span `1 + overflow` consecutive pages;
//! - page header (16 bytes): `id` u64, `flags` u16 (branch 0x01, leaf 0x02, meta 0x04,
//!   freelist 0x10), `count` u16 (elements), `overflow` u32;
//! - pages 0 and 1 are meta pages: after the header, `magic` u32 = 0xED0CDAED, `version`
//!   u32 = 2, `page_size` u32, `flags` u32, root bucket (`root` pgid u64, `sequence` u64),
//!   `freelist` pgid u64 (all ones: not stored), `pgid` u64 (high-water mark: pages below it
//!   are in use), `txid` u64, `checksum` u64 = FNV-1a 64 of the 56 bytes before it. The valid
//!   meta with the larger `txid` is current;
//! - branch element (16 bytes each, after the header): `pos` u32, `ksize` u32, `pgid` u64;
//!   the key is at the element's address + `pos`. Element `i` covers keys `>= key(i)`;
//! - leaf element (16 bytes): `flags` u32 (0x01 = the value is a sub-bucket), `pos` u32,
//!   `ksize` u32, `vsize` u32; key at the element's address + `pos`, value right after it;
//! - a bucket value is `root` pgid u64 + `sequence` u64; when `root` is 0 the bucket is
//!   inline: a page (header + elements) follows in the value itself.
//!
//! Every offset is bounds-checked and every page id is checked against the high-water mark
//! and the file length, so a corrupt file yields [`EtcdDbError::Invalid`], never a panic.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{EtcdDbError, Result};

/// bbolt's magic number (`magic`).
pub const MAGIC: u32 = 0xED0C_DAED;
/// bbolt's data file format version (`version`).
pub const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const BUCKET_LEAF: u32 = 0x01;
const BUCKET_HEADER: usize = 16;
/// Deeper than any real B+tree of this page size; bounds the walk on a corrupt file.
const MAX_DEPTH: usize = 64;

/// The current meta page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaPage {
    /// Page size in bytes.
    pub page_size: u32,
    /// Root page of the root bucket (whose entries are the top-level buckets).
    pub root: u64,
    /// High-water mark: pages `< pgid` are part of the database.
    pub pgid: u64,
    /// Transaction ID of the last commit.
    pub txid: u64,
}

/// An open bbolt file (read-only).
pub struct BoltFile {
    file: File,
    /// Bytes of the file that belong to the database (a snapshot's trailing hash excluded).
    len: u64,
    meta: MetaPage,
}

/// A bucket: its root page, or its inline page.
#[derive(Clone)]
pub struct Bucket {
    root: u64,
    inline: Option<Page>,
}

/// One leaf entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Vec<u8>,
    /// The value (a bucket header when `is_bucket`).
    pub value: Vec<u8>,
    /// Whether the value is a nested bucket.
    pub is_bucket: bool,
}

fn invalid(why: impl Into<String>) -> EtcdDbError {
    EtcdDbError::Invalid(why.into())
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// FNV-1a 64 (Go's `hash/fnv.New64a`), bbolt's meta checksum.
fn fnv64a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parses the meta page in `page` (header included); `None` if it is not a valid meta.
fn parse_meta(page: &[u8]) -> Option<MetaPage> {
    let m = page.get(PAGE_HEADER..PAGE_HEADER + 64)?;
    let (magic, version, page_size) = (u32_at(m, 0)?, u32_at(m, 4)?, u32_at(m, 8)?);
    if magic != MAGIC || version != VERSION || fnv64a(&m[..56]) != u64_at(m, 56)? {
        return None;
    }
    Some(MetaPage {
        page_size,
        root: u64_at(m, 16)?,
        pgid: u64_at(m, 40)?,
        txid: u64_at(m, 48)?,
    })
}

impl BoltFile {
    /// Opens the database in the first `len` bytes of `file`.
    ///
    /// Errors: [`EtcdDbError::Invalid`] when neither meta page is valid, or the high-water
    /// mark lies beyond `len`.
    pub fn open(file: File, len: u64) -> Result<BoltFile> {
        let mut first = vec![0u8; 4096.min(len as usize)];
        file.read_exact_at(&mut first, 0)?;
        // The page size is in meta 0; if meta 0 is torn, meta 1 sits at the OS page size.
        let meta0 = parse_meta(&first);
        let page_size = match meta0 {
            Some(m) => m.page_size as u64,
            None => 4096,
        };
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(invalid(format!("page size {page_size}")));
        }
        let meta1 = if len >= 2 * page_size {
            let mut second = vec![0u8; page_size as usize];
            file.read_exact_at(&mut second, page_size)?;
            parse_meta(&second).filter(|m| u64::from(m.page_size) == page_size)
        } else {
            None
        };
        let meta = match (meta0, meta1) {
            (Some(a), Some(b)) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => return Err(invalid("no valid meta page (not a bbolt file?)")),
        };
        let needed = meta.pgid.checked_mul(page_size);
        if needed.is_none_or(|n| n > len) {
            return Err(invalid(format!(
                "high-water page {} needs {} bytes, the file has {len}",
                meta.pgid,
                meta.pgid.saturating_mul(page_size)
            )));
        }
        Ok(BoltFile { file, len, meta })
    }

    /// The current meta page.
    pub fn meta(&self) -> MetaPage {
        self.meta
    }

    /// The database size as Go's `tx.Size()` reports it: high-water page × page size.
    pub fn size(&self) -> u64 {
        self.meta.pgid * u64::from(self.meta.page_size)
    }

    /// The root bucket; its entries are the top-level buckets.
    pub fn root(&self) -> Bucket {
        Bucket {
            root: self.meta.root,
            inline: None,
        }
    }

    /// The top-level bucket `name`, if present.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket>> {
        match self.get_entry(&self.root(), name)? {
            Some(e) if e.is_bucket => Ok(Some(bucket_from_value(&e.value)?)),
            Some(_) => Err(invalid(format!(
                "{} is a value, not a bucket",
                name.escape_ascii()
            ))),
            None => Ok(None),
        }
    }

    /// The value of `key` in `bucket` (`None` if absent or a nested bucket).
    pub fn get(&self, bucket: &Bucket, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get_entry(bucket, key)?
            .filter(|e| !e.is_bucket)
            .map(|e| e.value))
    }

    /// Every entry of `bucket` in key order, read page by page.
    pub fn entries(&self, bucket: &Bucket) -> Entries<'_> {
        Entries {
            db: self,
            start: Some(bucket.clone()),
            stack: Vec::new(),
            failed: false,
        }
    }

    fn get_entry(&self, bucket: &Bucket, key: &[u8]) -> Result<Option<Entry>> {
        let mut page = self.bucket_root(bucket)?;
        for _ in 0..MAX_DEPTH {
            match page.flags() {
                LEAF => {
                    for i in 0..page.count() {
                        let e = page.leaf(i)?;
                        if e.key == key {
                            return Ok(Some(e));
                        }
                    }
                    return Ok(None);
                }
                BRANCH => {
                    // The last element whose key is <= `key` (bbolt `Cursor.searchPage`).
                    let mut child = None;
                    for i in 0..page.count() {
                        let (k, pgid) = page.branch(i)?;
                        if i > 0 && k > key {
                            break;
                        }
                        child = Some(pgid);
                    }
                    match child {
                        Some(pgid) => page = self.page(pgid)?,
                        None => return Ok(None),
                    }
                }
                f => return Err(invalid(format!("page {} has flags {f:#x}", page.id()))),
            }
        }
        Err(invalid("tree deeper than 64 levels"))
    }

    fn bucket_root(&self, bucket: &Bucket) -> Result<Page> {
        match &bucket.inline {
            Some(p) => Ok(p.clone()),
            None => self.page(bucket.root),
        }
    }

    /// Reads page `pgid` with its overflow pages.
    fn page(&self, pgid: u64) -> Result<Page> {
        // Pages 0 and 1 are meta pages; bucket pages lie between them and the high-water mark.
        if pgid < 2 || pgid >= self.meta.pgid {
            return Err(invalid(format!(
                "page {pgid} outside the database (high water {})",
                self.meta.pgid
            )));
        }
        let ps = u64::from(self.meta.page_size);
        let mut buf = vec![0u8; ps as usize];
        self.file.read_exact_at(&mut buf, pgid * ps)?;
        let overflow = u32_at(&buf, 12).unwrap_or(0) as u64;
        if overflow > 0 {
            let end = pgid + 1 + overflow;
            if end > self.meta.pgid || end * ps > self.len {
                return Err(invalid(format!("page {pgid} overflows past the database")));
            }
            buf.resize(((1 + overflow) * ps) as usize, 0);
            self.file
                .read_exact_at(&mut buf[ps as usize..], (pgid + 1) * ps)?;
        }
        let page = Page::new(buf)?;
        if page.id() != pgid {
            return Err(invalid(format!("page {pgid} carries id {}", page.id())));
        }
        Ok(page)
    }
}

/// The bucket described by a bucket value (header, then an inline page when `root` is 0).
fn bucket_from_value(v: &[u8]) -> Result<Bucket> {
    let root = u64_at(v, 0).ok_or_else(|| invalid("bucket value shorter than its header"))?;
    let inline = if root == 0 {
        let page = v
            .get(BUCKET_HEADER..)
            .ok_or_else(|| invalid("bucket value shorter than its header"))?;
        Some(Page::new(page.to_vec())?)
    } else {
        None
    };
    Ok(Bucket { root, inline })
}

/// One page's bytes (shared: inline pages are cloned with their bucket).
#[derive(Clone)]
struct Page(Arc<[u8]>);

impl Page {
    fn new(buf: Vec<u8>) -> Result<Page> {
        if buf.len() < PAGE_HEADER {
            return Err(invalid("page shorter than its header"));
        }
        let p = Page(buf.into());
        if PAGE_HEADER + p.count() * ELEMENT > p.0.len() {
            return Err(invalid(format!(
                "page {} has {} elements, more than fit",
                p.id(),
                p.count()
            )));
        }
        Ok(p)
    }
    fn id(&self) -> u64 {
        u64_at(&self.0, 0).unwrap_or(0)
    }
    fn flags(&self) -> u16 {
        u16_at(&self.0, 8).unwrap_or(0)
    }
    fn count(&self) -> usize {
        u16_at(&self.0, 10).unwrap_or(0) as usize
    }
    fn slice(&self, at: usize, len: usize) -> Result<&[u8]> {
        at.checked_add(len)
            .and_then(|end| self.0.get(at..end))
            .ok_or_else(|| invalid(format!("element of page {} out of bounds", self.id())))
    }
    fn leaf(&self, i: usize) -> Result<Entry> {
        let at = PAGE_HEADER + i * ELEMENT;
        let e = self.slice(at, ELEMENT)?;
        let (flags, pos, ksize, vsize) = (
            u32_at(e, 0).unwrap_or(0),
            u32_at(e, 4).unwrap_or(0) as usize,
            u32_at(e, 8).unwrap_or(0) as usize,
            u32_at(e, 12).unwrap_or(0) as usize,
        );
        let key = self.slice(at + pos, ksize)?.to_vec();
        let value = self.slice(at + pos + ksize, vsize)?.to_vec();
        Ok(Entry {
            key,
            value,
            is_bucket: flags & BUCKET_LEAF != 0,
        })
    }
    fn branch(&self, i: usize) -> Result<(&[u8], u64)> {
        let at = PAGE_HEADER + i * ELEMENT;
        let e = self.slice(at, ELEMENT)?;
        let (pos, ksize, pgid) = (
            u32_at(e, 0).unwrap_or(0) as usize,
            u32_at(e, 4).unwrap_or(0) as usize,
            u64_at(e, 8).unwrap_or(0),
        );
        Ok((self.slice(at + pos, ksize)?, pgid))
    }
}

/// Iterator over a bucket's entries in key order ([`BoltFile::entries`]). After an error it
/// ends.
pub struct Entries<'a> {
    db: &'a BoltFile,
    start: Option<Bucket>,
    /// The path from the bucket's root to the current page, with the next element of each.
    stack: Vec<(Page, usize)>,
    failed: bool,
}

impl Entries<'_> {
    fn step(&mut self) -> Result<Option<Entry>> {
        if let Some(b) = self.start.take() {
            self.stack.push((self.db.bucket_root(&b)?, 0));
        }
        while let Some((page, next)) = self.stack.last_mut() {
            if *next >= page.count() {
                self.stack.pop();
                continue;
            }
            let i = *next;
            *next += 1;
            match page.flags() {
                LEAF => return page.leaf(i).map(Some),
                BRANCH => {
                    let (_, pgid) = page.branch(i)?;
                    if self.stack.len() >= MAX_DEPTH {
                        return Err(invalid("tree deeper than 64 levels"));
                    }
                    let child = self.db.page(pgid)?;
                    self.stack.push((child, 0));
                }
                f => return Err(invalid(format!("page {} has flags {f:#x}", page.id()))),
            }
        }
        Ok(None)
    }
}

impl Iterator for Entries<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(e) => e.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

impl Entry {
    /// The nested bucket this entry describes (`is_bucket` must be set).
    pub fn as_bucket(&self) -> Result<Bucket> {
        if !self.is_bucket {
            return Err(invalid(format!(
                "{} is a value, not a bucket",
                self.key.escape_ascii()
            )));
        }
        bucket_from_value(&self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_value_shorter_than_its_header_is_an_error() {
        // root 0 (an inline bucket) in 8 bytes: the 16-byte header is cut (a fuzz finding).
        let err = bucket_from_value(&[0u8; 8]).err().expect("an error");
        assert!(err.to_string().contains("shorter than its header"), "{err}");
        assert!(bucket_from_value(&[0u8; 4]).is_err());
    }

    #[test]
    fn fnv64a_matches_go() {
        // Go: fnv.New64a() over "" and "a".
        assert_eq!(fnv64a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv64a(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn garbage_is_not_a_database() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        let f = File::open(&p).unwrap();
        let err = BoltFile::open(f, 8192).err().unwrap();
        assert!(err.to_string().contains("no valid meta page"), "{err}");
    }
}
