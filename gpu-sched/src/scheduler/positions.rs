//! A set of environment positions as bits, walked in position order from any position,
//! wrapping round: the ready environments with a free GPU (`Scheduler::with_free_gpus`). On a
//! full cluster of 1 000 a walk visits the one or two where a trial just ended.

#[derive(Debug, Clone, Default)]
pub(crate) struct Positions {
    words: Vec<u64>,
    len: usize,
}

impl Positions {
    pub fn insert(&mut self, position: usize) {
        let word = position / 64;
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let bit = 1 << (position % 64);
        if self.words[word] & bit == 0 {
            self.words[word] |= bit;
            self.len += 1;
        }
    }

    pub fn remove(&mut self, position: usize) {
        let bit = 1 << (position % 64);
        if let Some(word) = self
            .words
            .get_mut(position / 64)
            .filter(|word| **word & bit != 0)
        {
            *word &= !bit;
            self.len -= 1;
        }
    }

    /// How many positions the set holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The positions in the set from `first` on, then those before it.
    pub fn walk_from(&self, first: usize) -> Walk<'_> {
        let word = first / 64;
        Walk {
            words: &self.words,
            first,
            base: word * 64,
            bits: self
                .words
                .get(word)
                .map_or(0, |&bits| bits & (!0u64 << (first % 64))),
            next_word: word + 1,
            wrapped: false,
            done: false,
        }
    }
}

/// See [`Positions::walk_from`].
pub(crate) struct Walk<'a> {
    words: &'a [u64],
    first: usize,
    /// The position of the lowest bit of `bits`' word.
    base: usize,
    /// What is left to visit of the current word.
    bits: u64,
    next_word: usize,
    /// Walking the positions before `first`.
    wrapped: bool,
    done: bool,
}

impl Iterator for Walk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        loop {
            if self.bits != 0 {
                let position = self.base + self.bits.trailing_zeros() as usize;
                self.bits &= self.bits - 1;
                if self.wrapped && position >= self.first {
                    self.done = true;
                    self.bits = 0;
                    return None;
                }
                return Some(position);
            }
            if self.done {
                return None;
            }
            if self.next_word >= self.words.len() {
                if self.wrapped || self.first == 0 {
                    self.done = true;
                    return None;
                }
                self.wrapped = true;
                self.next_word = 0;
                continue;
            }
            if self.wrapped && self.next_word * 64 >= self.first {
                self.done = true;
                return None;
            }
            self.base = self.next_word * 64;
            self.bits = self.words[self.next_word];
            self.next_word += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_visits_each_member_once_from_its_first_position_wrapping_round() {
        // A few shapes of set over 200 positions (four words), against the plain answer.
        let sets: [&[usize]; 6] = [
            &[],
            &[0],
            &[63, 64, 65],
            &[5, 70, 130, 199],
            &[1, 2, 3, 127, 128, 191, 192],
            &(0..200).collect::<Vec<_>>(),
        ];
        for members in sets {
            let mut set = Positions::default();
            for &position in members {
                set.insert(position);
            }
            for first in [0, 1, 3, 63, 64, 65, 128, 150, 199, 200, 500] {
                let expected: Vec<usize> = members
                    .iter()
                    .copied()
                    .filter(|&p| p >= first)
                    .chain(members.iter().copied().filter(|&p| p < first))
                    .collect();
                assert_eq!(
                    set.walk_from(first).collect::<Vec<_>>(),
                    expected,
                    "{members:?} from {first}"
                );
            }
        }
        let mut set = Positions::default();
        set.insert(70);
        set.insert(3);
        set.remove(70);
        set.remove(1000);
        set.remove(70);
        set.insert(3);
        assert_eq!(set.walk_from(10).collect::<Vec<_>>(), [3]);
        assert_eq!(set.len(), 1);
    }
}
