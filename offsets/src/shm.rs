//! The only `unsafe` of the publication path: mapping the offsets file and
//! the seqlock over that shared memory.
//!
//! Every shared access is a word-sized atomic (`AtomicU64`), so a racing
//! writer in another process is never a data race in the Rust memory model;
//! the sequence word tells the reader whether the words it copied belong to
//! one record. Protocol (Boehm, "Can seqlocks get along with programming
//! language memory models?", 2012):
//! - writer: `seq = s+1` (odd), release fence, payload stores, `seq = s+2`
//!   with release ordering;
//! - reader: `s1 = seq` (acquire), payload loads, acquire fence, `s2 = seq`;
//!   the copy is good when `s1 == s2` and `s1` is even.
//!
//! The writer never waits for readers; a reader retries a bounded number of
//! times and then reports "busy".

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use super::layout::{FILE_LEN, HEADER_LEN, SEQ_OFFSET};

/// The header words of `file`, read with `pread` before anything is
/// mapped, so a file of another version is told apart from a short one.
pub fn read_header(file: &File) -> io::Result<[u64; HEADER_LEN / 8]> {
    use std::os::unix::fs::FileExt;
    let mut bytes = [0u8; HEADER_LEN];
    file.read_exact_at(&mut bytes, 0)?;
    let mut h = [0u64; HEADER_LEN / 8];
    for (i, w) in h.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        *w = u64::from_le_bytes(b);
    }
    Ok(h)
}

/// A `FILE_LEN`-byte shared mapping of the offsets file.
pub struct Mapping {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics;
// moving or sharing the handle between threads is as safe as sharing
// `&[AtomicU64]`.
unsafe impl Send for Mapping {}
// SAFETY: see `Send`; every access goes through `&AtomicU64`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `FILE_LEN` bytes of `file`, shared, read-only or
    /// read-write. The file must be at least that long (checked here, so a
    /// short file is an error and not a SIGBUS later).
    pub fn map(file: &File, writable: bool) -> io::Result<Self> {
        let len = file.metadata()?.len();
        if len < FILE_LEN as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("offsets file is {len} bytes, expected {FILE_LEN}"),
            ));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping (addr = null) of a file descriptor we own
        // for the duration of the call; the kernel checks fd and protection.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_LEN,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { base })
    }

    /// The 8-byte word at `byte_offset`.
    fn word(&self, byte_offset: usize) -> &AtomicU64 {
        assert!(byte_offset.is_multiple_of(8) && byte_offset + 8 <= FILE_LEN);
        // SAFETY: in bounds (asserted) of a live mapping that outlives
        // `&self`; 8-aligned because mmap returns page-aligned memory;
        // AtomicU64 has the layout of u64, and all accesses to this memory
        // (here and in other processes' readers/writer) are atomic.
        unsafe { &*self.base.as_ptr().add(byte_offset).cast::<AtomicU64>() }
    }

    pub fn load(&self, byte_offset: usize) -> u64 {
        self.word(byte_offset).load(Ordering::Relaxed)
    }

    /// The ring's live records, newest first: (record number, slot byte
    /// offset), up to the first slot that holds another number (never
    /// written, overwritten, or cleared by a restarted writer).
    pub fn ring_slots(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        let head = self.load(super::layout::RING_HEAD_OFFSET);
        (1..=head)
            .rev()
            .take(super::layout::RING_SLOTS)
            .map(|n| (n, super::layout::slot_offset(n)))
            .take_while(|&(n, base)| self.load(base) == n)
    }

    /// Only valid on a writable mapping (the writer's).
    pub fn store(&self, byte_offset: usize, value: u64) {
        self.word(byte_offset).store(value, Ordering::Relaxed);
    }

    /// Seqlock write of word runs `(byte offset, words)`, all inside one
    /// write of the sequence. Never blocks.
    pub fn seq_write(&self, parts: &[(usize, &[u64])]) {
        let seq = self.word(SEQ_OFFSET);
        let s = seq.load(Ordering::Relaxed);
        // An odd value left by a killed writer is made odd-in-progress again.
        let odd = s | 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        for (offset, words) in parts {
            for (i, v) in words.iter().enumerate() {
                self.store(offset + 8 * i, *v);
            }
        }
        seq.store(odd + 1, Ordering::Release);
    }

    /// One seqlock read attempt: `copy` loads the words it needs (relaxed
    /// loads through [`Mapping::load`]); its result is returned only when
    /// no write overlapped. Whatever `copy` computes from a torn copy is
    /// discarded, so it must only index within the file (it cannot fault:
    /// `load` checks bounds).
    pub fn seq_try_read<R>(&self, copy: impl FnOnce(&Self) -> R) -> Option<R> {
        let seq = self.word(SEQ_OFFSET);
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let r = copy(self);
        fence(Ordering::Acquire);
        (seq.load(Ordering::Relaxed) == s1).then_some(r)
    }

    /// Copies `out.len()` words from `byte_offset` (inside a seqlock read).
    pub fn load_words(&self, byte_offset: usize, out: &mut [u64]) {
        for (i, v) in out.iter_mut().enumerate() {
            *v = self.load(byte_offset + 8 * i);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mapped in `map`; no reference
        // into it outlives `self` (all borrows are tied to `&self`).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), FILE_LEN);
        }
    }
}
