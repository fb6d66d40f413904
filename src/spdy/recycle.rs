//! Read buffers that live for the whole connection.
//!
//! A bulk transfer reads into a buffer, cuts frames out of it as shared
//! slices and hands them on; the buffer cannot be refilled in place until
//! every slice of it is dropped. Allocating a fresh block each time instead
//! costs more than the copy itself with the static build's allocator, which
//! maps large blocks on demand and unmaps them when freed: page faults on
//! every first touch, TLB shootdowns on every unmap (docs/benchmarks.md,
//! "Port-forward"). A [`Recycler`] keeps the blocks whose slices are all
//! gone and fills them again.

use bytes::BytesMut;

/// Hands out read room from a small set of blocks reused for the life of a
/// connection: blocks of `block` bytes, at most `keep` of them held as
/// spares. Room beyond a block is given in a block of its own, used once.
#[derive(Debug)]
pub struct Recycler {
    block: usize,
    keep: usize,
    spare: Vec<BytesMut>,
    /// Whether the buffer writes into one of this recycler's blocks.
    current_is_block: bool,
}

impl Recycler {
    pub fn new(block: usize, keep: usize) -> Self {
        Self {
            block,
            keep,
            spare: Vec::new(),
            current_is_block: false,
        }
    }

    /// Make room in `buf` for at least `min_free` more bytes, keeping what
    /// it holds: in place if nothing else still uses its block, else in a
    /// spare block that is free again, else in a new one. The block left
    /// behind becomes a spare (or is dropped when `keep` are held).
    pub fn make_room(&mut self, buf: &mut BytesMut, min_free: usize) {
        if buf.capacity() - buf.len() >= min_free || buf.try_reclaim(min_free) {
            return;
        }
        let size = buf.len() + min_free;
        let (mut next, is_block) = if size <= self.block {
            (self.take(), true)
        } else {
            (BytesMut::with_capacity(size), false)
        };
        next.extend_from_slice(buf);
        let mut old = std::mem::replace(buf, next);
        if std::mem::replace(&mut self.current_is_block, is_block) && self.spare.len() < self.keep {
            old.clear();
            self.spare.push(old);
        }
    }

    /// An empty block: a spare whose earlier slices have all been dropped,
    /// or a new one.
    fn take(&mut self) -> BytesMut {
        let block = self.block;
        match self.spare.iter_mut().position(|b| b.try_reclaim(block)) {
            Some(i) => self.spare.swap_remove(i),
            None => BytesMut::with_capacity(block),
        }
    }

    /// Blocks held as spares.
    #[cfg(test)]
    fn spares(&self) -> usize {
        self.spare.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address of the block a buffer writes into next.
    fn block(b: &BytesMut) -> usize {
        b.as_ptr() as usize
    }

    #[test]
    fn room_is_made_in_place_once_every_slice_is_gone() {
        let mut r = Recycler::new(64, 4);
        let mut buf = BytesMut::with_capacity(64);
        let start = block(&buf);
        buf.extend_from_slice(&[1; 60]);
        let frame = buf.split_to(60).freeze();
        drop(frame);
        r.make_room(&mut buf, 16);
        assert_eq!(block(&buf), start, "the same block, from its start");
        assert!(buf.capacity() >= 64);
        assert_eq!(r.spares(), 0);
    }

    #[test]
    fn a_block_still_in_use_is_kept_aside_and_reused_once_free() {
        let mut r = Recycler::new(64, 4);
        let mut buf = BytesMut::new();
        r.make_room(&mut buf, 16);
        let first = block(&buf);
        assert!(buf.capacity() >= 64, "a whole block");
        buf.extend_from_slice(&[1; 60]);
        let held = buf.split_to(56).freeze();
        // Four bytes of a frame not yet complete stay in the buffer.
        r.make_room(&mut buf, 16);
        assert_ne!(block(&buf), first, "a new block while the frame is held");
        assert_eq!(&buf[..], &[1; 4], "the partial frame moved along");
        assert!(buf.capacity() - buf.len() >= 16);
        assert_eq!(r.spares(), 1);
        // Fill the second block, then free the first: it is used again.
        let second = block(&buf);
        buf.extend_from_slice(&[2; 60]);
        let held2 = buf.split_to(buf.len()).freeze();
        drop(held);
        r.make_room(&mut buf, 16);
        assert_eq!(block(&buf), first, "the first block, free again");
        assert_eq!(r.spares(), 1, "the second block waits its turn");
        assert_ne!(second, first);
        assert_eq!(&held2[..4], &[1; 4], "a held slice is never written over");
    }

    #[test]
    fn no_more_than_keep_spares_are_held() {
        let mut r = Recycler::new(32, 2);
        let mut buf = BytesMut::new();
        let mut held = Vec::new();
        for _ in 0..5 {
            r.make_room(&mut buf, 32);
            buf.extend_from_slice(&[7; 32]);
            held.push(buf.split_to(32).freeze());
        }
        assert_eq!(r.spares(), 2);
        assert!(
            held.iter().all(|h| h[..] == [7; 32]),
            "no slice was overwritten"
        );
    }

    #[test]
    fn a_nearly_full_buffer_gets_room() {
        let mut r = Recycler::new(64, 4);
        let mut buf = BytesMut::new();
        r.make_room(&mut buf, 16);
        let room = buf.capacity() - buf.len();
        buf.extend(std::iter::repeat_n(1u8, room - 4));
        // Four bytes free, sixteen wanted: more room, in place or not.
        r.make_room(&mut buf, 16);
        assert!(
            buf.capacity() - buf.len() >= 16,
            "{} free",
            buf.capacity() - buf.len()
        );
        assert_eq!(buf.len(), room - 4, "nothing lost");
    }

    #[test]
    fn a_buffer_with_room_is_left_alone() {
        let mut r = Recycler::new(64, 4);
        let mut buf = BytesMut::with_capacity(128);
        buf.extend_from_slice(b"abc");
        let start = block(&buf);
        r.make_room(&mut buf, 100);
        assert_eq!((block(&buf), &buf[..]), (start, &b"abc"[..]));
        assert_eq!(r.spares(), 0);
    }

    #[test]
    fn room_beyond_a_block_is_given_once_and_not_kept() {
        let mut r = Recycler::new(16, 4);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"xy");
        let held = buf.split_to(1).freeze();
        r.make_room(&mut buf, 1000);
        assert!(buf.capacity() - buf.len() >= 1000);
        assert_eq!(&buf[..], b"y");
        assert_eq!(&held[..], b"x");
        // Moving on from the large block does not keep it...
        let large = fill_and_hold(&mut buf);
        r.make_room(&mut buf, 8);
        assert!(buf.capacity() >= 16);
        assert_eq!(r.spares(), 0, "only blocks of the usual size are kept");
        // ...moving on from a usual one does.
        let usual = fill_and_hold(&mut buf);
        r.make_room(&mut buf, 8);
        assert_eq!(r.spares(), 1);
        drop((large, usual));
    }

    /// Fill what room `buf` has and take it all out, held.
    fn fill_and_hold(buf: &mut BytesMut) -> bytes::Bytes {
        let room = buf.capacity() - buf.len();
        buf.extend(std::iter::repeat_n(9u8, room));
        buf.split().freeze()
    }
}
