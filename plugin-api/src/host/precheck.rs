//! Checks a plugin file before `dlopen`: the dynamic loader maps the segments the program
//! headers describe and reads the dynamic section through them, so a file cut short (a copy
//! interrupted, a full disk) makes it touch pages past the end of the file, and the process dies
//! of SIGBUS with no message. Here every range the loader will use is checked against the file
//! first, so such a file gets a one-line refusal and the other plugins still load.
//!
//! Only what the loader reads to map the file and find its symbols is checked: the program
//! headers, every segment's bytes, the segments it reads in memory (dynamic, notes, TLS image),
//! the tables the dynamic section points to, and in those tables every offset and index the
//! loader follows (`check_tables`: names against the string table, hash buckets and chains,
//! symbols, version records, relocations' targets and relative addresses, and what ld.so
//! asserts). A file that passes may still be refused by `dlopen` itself (wrong architecture,
//! say), with its message. A damaged byte whose value still points inside the library (a
//! relocation moved to another slot, a wrong instruction, a wrong pointer in data abi_stable
//! reads) is not found, and can still crash the process when the library is loaded or called:
//! only a probe in a child process would catch those. This guards against damage, not against
//! a file crafted to harm: loading a plugin runs its code anyway.

use object::elf::{self, FileHeader64, ProgramHeader64};
use object::read::elf::{Dyn, ElfFile64, FileHeader, ProgramHeader};
use object::{Endian, Endianness, Object, ObjectSymbol, ReadCache, ReadRef, SymbolKind};

/// Dynamic entries whose value is an address the loader reads (or calls) in the mapped file,
/// with the entry that gives the size of what is there, where there is one.
const ADDRESS_TAGS: &[(u32, Option<u32>)] = &[
    (elf::DT_PLTGOT, None),
    (elf::DT_HASH, None),
    (elf::DT_STRTAB, Some(elf::DT_STRSZ)),
    (elf::DT_SYMTAB, None),
    (elf::DT_RELA, Some(elf::DT_RELASZ)),
    (elf::DT_INIT, None),
    (elf::DT_FINI, None),
    (elf::DT_REL, Some(elf::DT_RELSZ)),
    (elf::DT_JMPREL, Some(elf::DT_PLTRELSZ)),
    (elf::DT_INIT_ARRAY, Some(elf::DT_INIT_ARRAYSZ)),
    (elf::DT_FINI_ARRAY, Some(elf::DT_FINI_ARRAYSZ)),
    (elf::DT_GNU_HASH, None),
    (elf::DT_VERSYM, None),
    (elf::DT_VERDEF, None),
    (elf::DT_VERNEED, None),
];

/// Segments the loader reads in memory, after mapping the loadable ones: each must lie within
/// one of them.
const READ_IN_MEMORY: &[u32] = &[
    elf::PT_DYNAMIC,
    elf::PT_NOTE,
    elf::PT_TLS,
    elf::PT_GNU_PROPERTY,
    elf::PT_GNU_EH_FRAME,
];

/// What a file that passes looks like, for messages and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfSummary {
    /// `PT_LOAD` segments, all within the file.
    pub load_segments: usize,
    /// Entries of the dynamic section before its `DT_NULL`.
    pub dynamic_entries: usize,
}

/// Checks the plugin file at `path`, reading only its headers and dynamic section.
pub fn check_file(path: &std::path::Path) -> Result<ElfSummary, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    // A directory opens, and then reads as a damaged header.
    if file.metadata().is_ok_and(|meta| meta.is_dir()) {
        return Err("is a directory, not a plugin file".into());
    }
    check(&ReadCache::new(BlockReader::new(file)))
}

/// A file read in blocks of [`BlockReader::BLOCK`] bytes, each block once, for `object`'s
/// `ReadCache`, which reads every range it is asked for with a seek and a read of its own: the
/// check asks for each symbol and relocation of the library, and a plugin took 77 000 of each
/// (about 30 ms of every command that scans the plugin path). Seeking here moves a position
/// only. Read with `pread`, not mapped: a file cut short would raise SIGBUS in a mapping, and
/// reads past its end here are only short.
struct BlockReader {
    file: std::fs::File,
    len: u64,
    position: u64,
    blocks: std::collections::HashMap<u64, Vec<u8>>,
}

impl BlockReader {
    const BLOCK: u64 = 64 * 1024;

    fn new(file: std::fs::File) -> BlockReader {
        let len = file.metadata().map_or(0, |meta| meta.len());
        BlockReader {
            file,
            len,
            position: 0,
            blocks: std::collections::HashMap::new(),
        }
    }
}

impl std::io::Read for BlockReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let index = self.position / BlockReader::BLOCK;
        let block = match self.blocks.entry(index) {
            std::collections::hash_map::Entry::Occupied(block) => block.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let mut bytes = vec![0; BlockReader::BLOCK as usize];
                let mut filled = 0;
                // Short only at the file's end (or where it was cut since).
                while filled < bytes.len() {
                    let start = index * BlockReader::BLOCK + filled as u64;
                    match self.file.read_at(&mut bytes[filled..], start) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                bytes.truncate(filled);
                slot.insert(bytes)
            }
        };
        let within = (self.position - index * BlockReader::BLOCK) as usize;
        let available = block.get(within..).unwrap_or_default();
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.position += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for BlockReader {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let position = match to {
            std::io::SeekFrom::Start(offset) => Some(offset),
            std::io::SeekFrom::End(delta) => self.len.checked_add_signed(delta),
            std::io::SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        self.position = position.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a seek before the file's start",
            )
        })?;
        Ok(self.position)
    }
}

/// Checks a whole file's bytes (what the fuzz target drives).
pub fn check_bytes(data: &[u8]) -> Result<ElfSummary, String> {
    check(data)
}

fn check<'data, R: ReadRef<'data>>(data: R) -> Result<ElfSummary, String> {
    let file_len = data
        .len()
        .map_err(|()| "cannot read its length".to_string())?;
    let header = FileHeader64::<Endianness>::parse(data)
        .map_err(|_| "not a 64-bit ELF file: its header is missing or damaged".to_string())?;
    let endian = header
        .endian()
        .map_err(|_| "an ELF file of unknown byte order".to_string())?;
    if header.e_type(endian) != elf::ET_DYN {
        return Err("an ELF file that is not a shared library".into());
    }
    let segments: &[ProgramHeader64<Endianness>] = header
        .program_headers(endian, data)
        .map_err(|_| truncated("its program headers lie"))?;
    let mut loads: Vec<(u64, u64)> = Vec::new();
    // (address, file offset, size in the file) of each loadable segment, to read its bytes.
    let mut mapped_bytes: Vec<(u64, u64, u64)> = Vec::new();
    for segment in segments {
        let (offset, size) = segment.file_range(endian);
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return Err(truncated(&format!(
                "{} lies",
                segment_name(segment.p_type(endian))
            )));
        }
        if segment.p_type(endian) == elf::PT_LOAD {
            let start = segment.p_vaddr(endian);
            // What is mapped: the file's bytes, then zeroes up to the size in memory.
            let mapped = segment.p_memsz(endian).max(size);
            let end = start
                .checked_add(mapped)
                .ok_or_else(|| "a loadable segment ends past the address space".to_string())?;
            loads.push((start, end));
            mapped_bytes.push((start, offset, size));
        }
    }
    if loads.is_empty() {
        return Err("an ELF file with nothing to load".into());
    }
    let within_loads = |start: u64, size: u64| {
        start.checked_add(size).is_some_and(|end| {
            loads
                .iter()
                .any(|&(first, last)| first <= start && end <= last)
        })
    };
    for segment in segments {
        let kind = segment.p_type(endian);
        if READ_IN_MEMORY.contains(&kind)
            && !within_loads(segment.p_vaddr(endian), segment.p_filesz(endian))
        {
            return Err(format!(
                "{} lies outside what is loaded: it is damaged",
                segment_name(kind)
            ));
        }
    }
    let mut dynamic_entries = None;
    for segment in segments {
        let Some(dynamic) = segment
            .dynamic(endian, data)
            .map_err(|_| truncated("its dynamic section lies"))?
        else {
            continue;
        };
        if dynamic_entries.is_some() {
            return Err("an ELF file with two dynamic sections: it is damaged".into());
        }
        let end = dynamic
            .iter()
            .position(|entry| entry.tag32(endian) == Some(elf::DT_NULL))
            .ok_or_else(|| "its dynamic section has no end (DT_NULL): it is damaged".to_string())?;
        let entries = &dynamic[..end];
        // The ELF standard defines tags up to DT_HIPROC; a larger one is a damaged tag (the
        // loader then misses the entry it was, and crashed for lack of it).
        if entries
            .iter()
            .any(|entry| entry.d_tag(endian) > u64::from(elf::DT_HIPROC))
        {
            return Err("its dynamic section has an entry of no known kind: it is damaged".into());
        }
        let value_of = |tag: u32| {
            entries
                .iter()
                .find(|entry| entry.tag32(endian) == Some(tag))
                .map(|entry| entry.d_val(endian))
        };
        for &(tag, size_tag) in ADDRESS_TAGS {
            let Some(address) = value_of(tag) else {
                continue;
            };
            // A table without its size is checked at its first byte.
            let size = size_tag.and_then(value_of).unwrap_or(1);
            if !within_loads(address, size) {
                return Err(format!(
                    "its dynamic section points outside what is loaded (tag {tag:#x}): it is damaged"
                ));
            }
        }
        let image = Image {
            data,
            endian,
            loads: &loads,
            mapped_bytes: &mapped_bytes,
        };
        check_tables(&image, header.e_machine(endian), entries)?;
        dynamic_entries = Some(entries.len());
    }
    let dynamic_entries =
        dynamic_entries.ok_or_else(|| "an ELF file without a dynamic section".to_string())?;
    Ok(ElfSummary {
        load_segments: loads.len(),
        dynamic_entries,
    })
}

/// The loaded image as the loader sees it: addresses, and the file's bytes behind them.
struct Image<'a, R> {
    data: R,
    endian: Endianness,
    loads: &'a [(u64, u64)],
    mapped_bytes: &'a [(u64, u64, u64)],
}

impl<'data, R: ReadRef<'data>> Image<'_, R> {
    fn within(&self, start: u64, size: u64) -> bool {
        start.checked_add(size).is_some_and(|end| {
            self.loads
                .iter()
                .any(|&(first, last)| first <= start && end <= last)
        })
    }

    /// From the lowest loaded address to the highest, ends included: where a pointer into the
    /// library (one past an object, `_end`) may point.
    fn spans(&self, address: u64) -> bool {
        let low = self.loads.iter().map(|l| l.0).min().unwrap_or(0);
        let high = self.loads.iter().map(|l| l.1).max().unwrap_or(0);
        (low..=high).contains(&address)
    }

    /// The `N` bytes of the file loaded at `address`. Tables lie in a segment's bytes from the
    /// file, not in the zeroes past them: so each loop over a table is bounded by the file's
    /// size, whatever its damaged header says.
    fn bytes<const N: usize>(&self, address: u64, what: &str) -> Result<[u8; N], String> {
        let (start, offset, _) = self
            .mapped_bytes
            .iter()
            .copied()
            .find(|&(start, _, size)| {
                address >= start
                    && address
                        .checked_add(N as u64)
                        .is_some_and(|end| end <= start.saturating_add(size))
            })
            .ok_or_else(|| damaged(what))?;
        let read = self
            .data
            .read_bytes_at(offset + (address - start), N as u64)
            .map_err(|()| damaged(what))?;
        read.try_into().map_err(|_| damaged(what))
    }

    fn u16(&self, address: u64, what: &str) -> Result<u16, String> {
        Ok(self.endian.read_u16_bytes(self.bytes(address, what)?))
    }

    fn u32(&self, address: u64, what: &str) -> Result<u32, String> {
        Ok(self.endian.read_u32_bytes(self.bytes(address, what)?))
    }

    fn u64(&self, address: u64, what: &str) -> Result<u64, String> {
        Ok(self.endian.read_u64_bytes(self.bytes(address, what)?))
    }
}

fn damaged(what: &str) -> String {
    format!("{what} is damaged")
}

/// Relocation types whose addend is an address in the library (`R_*_RELATIVE`,
/// `R_*_IRELATIVE`, the resolver called at load), by machine; other machines' are not checked.
fn address_relocations(machine: u16) -> &'static [u32] {
    match machine {
        // The relative type first (`check_tables` reads it so).
        elf::EM_X86_64 => &[elf::R_X86_64_RELATIVE, elf::R_X86_64_IRELATIVE],
        elf::EM_AARCH64 => &[elf::R_AARCH64_RELATIVE, elf::R_AARCH64_IRELATIVE],
        _ => &[],
    }
}

/// What the loader reads through the dynamic section's tables, checked where a damaged byte
/// would send it outside the library (and the process would die of SIGSEGV inside `dlopen` or
/// `dlsym`, with no message): string offsets against the string table's size, the hash tables'
/// buckets and chains against the symbol count, symbol names and addresses, version records,
/// and each relocation's target, symbol and (for an address) addend. A damaged byte that still
/// lands inside (a wrong address in the library, a wrong instruction) is not found here.
fn check_tables<'data, R: ReadRef<'data>>(
    image: &Image<'_, R>,
    machine: u16,
    entries: &[elf::Dyn64<Endianness>],
) -> Result<(), String> {
    let endian = image.endian;
    let all = |tag: u32| {
        entries
            .iter()
            .filter(move |entry| entry.tag32(endian) == Some(tag))
            .map(move |entry| entry.d_val(endian))
    };
    let value_of = |tag: u32| all(tag).next();
    let (Some(strtab), Some(strsz)) = (value_of(elf::DT_STRTAB), value_of(elf::DT_STRSZ)) else {
        return Err("its dynamic section has no string table: it is damaged".into());
    };
    // A string table ends in NUL, so every name that starts inside it ends inside it.
    if strsz == 0 || image.bytes::<1>(strtab.saturating_add(strsz - 1), "its string table")? != [0]
    {
        return Err("its string table does not end in NUL: it is damaged".into());
    }
    let name = |offset: u64, what: &str| {
        if offset < strsz {
            Ok(())
        } else {
            Err(format!(
                "{what} names a string past its string table: it is damaged"
            ))
        }
    };
    for (tag, what) in [
        (elf::DT_NEEDED, "a needed library (DT_NEEDED)"),
        (elf::DT_SONAME, "its own name (DT_SONAME)"),
        (elf::DT_RPATH, "its library path (DT_RPATH)"),
        (elf::DT_RUNPATH, "its library path (DT_RUNPATH)"),
    ] {
        for offset in all(tag) {
            name(offset, what)?;
        }
    }

    let symbols = symbol_count(image, &value_of)?;
    if let Some(symtab) = value_of(elf::DT_SYMTAB) {
        const SYM_SIZE: u64 = 24;
        if value_of(elf::DT_SYMENT).is_some_and(|size| size != SYM_SIZE) {
            return Err("its symbol table has entries of the wrong size: it is damaged".into());
        }
        for i in 1..symbols {
            let at = symtab.saturating_add(i * SYM_SIZE);
            let what = "its symbol table";
            name(u64::from(image.u32(at, what)?), "a symbol")?;
            let info = image.bytes::<1>(at.saturating_add(4), what)?[0];
            let section = image.u16(at.saturating_add(6), what)?;
            let value = image.u64(at.saturating_add(8), what)?;
            let defined = section != elf::SHN_UNDEF && section != elf::SHN_ABS;
            if defined && info & 0xf != elf::STT_TLS && !image.spans(value) {
                return Err("a symbol's address lies outside what is loaded: it is damaged".into());
            }
        }
    } else if symbols > 0 {
        return Err(
            "its dynamic section has hash tables but no symbol table: it is damaged".into(),
        );
    }

    let versions = check_versions(image, &value_of, &name)?;
    if let Some(versym) = value_of(elf::DT_VERSYM) {
        for i in 0..symbols {
            let index = image.u16(
                versym.saturating_add(2 * i),
                "its symbol versions (DT_VERSYM)",
            )? & 0x7fff;
            if index > versions.max(1) {
                return Err(
                    "a symbol's version is none the library defines or needs: it is damaged".into(),
                );
            }
        }
    }

    let addresses = address_relocations(machine);
    let pltrel = value_of(elf::DT_PLTREL).unwrap_or(u64::from(elf::DT_RELA));
    // glibc asserts these (the process aborts) or reads the entry size without looking
    // (SIGSEGV when it is missing); machines whose relocations carry addends take only those.
    let rela_only = !addresses.is_empty();
    let plt_kind_ok =
        pltrel == u64::from(elf::DT_RELA) || (!rela_only && pltrel == u64::from(elf::DT_REL));
    let rela_size_ok = value_of(elf::DT_RELA).is_none() || value_of(elf::DT_RELAENT) == Some(24);
    let rel_size_ok = value_of(elf::DT_REL).is_none() || value_of(elf::DT_RELENT) == Some(16);
    if !(plt_kind_ok && rela_size_ok && rel_size_ok) {
        return Err("its relocations are of the wrong kind or size: it is damaged".into());
    }
    // The first DT_RELACOUNT relocations are relative ones, which the loader applies without
    // looking at their type (it asserts it).
    let relative = value_of(elf::DT_RELACOUNT).unwrap_or(0);
    if let (Some(&kind), Some(rela)) = (addresses.first(), value_of(elf::DT_RELA)) {
        let entries = value_of(elf::DT_RELASZ).unwrap_or(0) / 24;
        if relative > entries {
            return Err(damaged("its count of relative relocations (DT_RELACOUNT)"));
        }
        for i in 0..relative {
            if image.u64(rela.saturating_add(24 * i + 8), "its relocations")? != u64::from(kind) {
                return Err(damaged("its count of relative relocations (DT_RELACOUNT)"));
            }
        }
    }
    let tables = [
        (value_of(elf::DT_RELA), value_of(elf::DT_RELASZ), true),
        (value_of(elf::DT_REL), value_of(elf::DT_RELSZ), false),
        (
            value_of(elf::DT_JMPREL),
            value_of(elf::DT_PLTRELSZ),
            pltrel == u64::from(elf::DT_RELA),
        ),
    ];
    for (start, size, with_addend) in tables {
        let (Some(start), Some(size)) = (start, size) else {
            continue;
        };
        let entry = if with_addend { 24 } else { 16 };
        let what = "its relocations";
        for at in (start..start.saturating_add(size)).step_by(entry) {
            let offset = image.u64(at, what)?;
            let info = image.u64(at.saturating_add(8), what)?;
            if !image.within(offset, 8) {
                return Err("a relocation writes outside what is loaded: it is damaged".into());
            }
            if info >> 32 >= symbols.max(1) {
                return Err(
                    "a relocation names a symbol past its symbol table: it is damaged".into(),
                );
            }
            if with_addend && addresses.contains(&(info as u32)) {
                let addend = image.u64(at.saturating_add(16), what)?;
                if !image.spans(addend) {
                    return Err("a relocation points outside what is loaded: it is damaged".into());
                }
            }
        }
    }
    Ok(())
}

/// How many dynamic symbols there are, from the hash tables the loader looks names up in,
/// whose buckets and chains are checked on the way: every index they hold is a symbol.
fn symbol_count<'data, R: ReadRef<'data>>(
    image: &Image<'_, R>,
    value_of: &dyn Fn(u32) -> Option<u64>,
) -> Result<u64, String> {
    let mut count = None;
    if let Some(hash) = value_of(elf::DT_HASH) {
        let what = "its hash table (DT_HASH)";
        let buckets = u64::from(image.u32(hash, what)?);
        let chains = u64::from(image.u32(hash.saturating_add(4), what)?);
        // The loader takes a name's hash modulo the bucket count.
        if buckets == 0 {
            return Err(damaged(what));
        }
        for i in 0..buckets + chains {
            if u64::from(image.u32(hash.saturating_add(8 + 4 * i), what)?) >= chains {
                return Err(damaged(what));
            }
        }
        count = Some(chains);
    }
    if let Some(gnu) = value_of(elf::DT_GNU_HASH) {
        let what = "its hash table (DT_GNU_HASH)";
        let buckets = u64::from(image.u32(gnu, what)?);
        let first = u64::from(image.u32(gnu.saturating_add(4), what)?);
        let bloom = u64::from(image.u32(gnu.saturating_add(8), what)?);
        // The loader takes a hash modulo the bucket count, and masks with the bloom size - 1.
        if buckets == 0 || !bloom.is_power_of_two() {
            return Err(damaged(what));
        }
        let buckets_at = bloom
            .checked_mul(8)
            .and_then(|size| gnu.saturating_add(16).checked_add(size))
            .ok_or_else(|| damaged(what))?;
        let chains_at = buckets_at.saturating_add(4 * buckets);
        let mut last = None;
        for i in 0..buckets {
            let symbol = u64::from(image.u32(buckets_at.saturating_add(4 * i), what)?);
            if symbol != 0 && symbol < first {
                return Err(damaged(what));
            }
            last = last.max((symbol != 0).then_some(symbol));
        }
        // The chain of the last bucket ends at the last symbol (its entry's low bit set);
        // every other chain ends before it.
        let mut end = first;
        if let Some(mut symbol) = last {
            loop {
                let entry = image.u32(chains_at.saturating_add(4 * (symbol - first)), what)?;
                if count.is_some_and(|count| symbol >= count) {
                    return Err(damaged(what));
                }
                if entry & 1 == 1 {
                    break;
                }
                symbol += 1;
            }
            end = symbol + 1;
        }
        count = Some(count.unwrap_or(end));
    }
    Ok(count.unwrap_or(0))
}

/// The version records (what the library defines and needs): each within the library, each
/// name within the string table. Returns the highest version index they give a symbol.
fn check_versions<'data, R: ReadRef<'data>>(
    image: &Image<'_, R>,
    value_of: &dyn Fn(u32) -> Option<u64>,
    name: &dyn Fn(u64, &str) -> Result<(), String>,
) -> Result<u16, String> {
    // Records link to the next by offset, so a damaged one can link to itself: the walk is
    // bounded (a real library has a handful).
    let mut budget = 1u32 << 16;
    let mut step = |what: &str| {
        budget = budget.checked_sub(1).ok_or_else(|| damaged(what))?;
        Ok::<(), String>(())
    };
    let field = |at: u64, offset: u64, what: &str| -> Result<u64, String> {
        Ok(u64::from(image.u32(at.saturating_add(offset), what)?))
    };
    let mut highest = 0;
    if let (Some(mut at), Some(count)) = (value_of(elf::DT_VERDEF), value_of(elf::DT_VERDEFNUM)) {
        let what = "its version definitions (DT_VERDEF)";
        for _ in 0..count {
            step(what)?;
            highest = highest.max(image.u16(at.saturating_add(4), what)? & 0x7fff);
            let names = image.u16(at.saturating_add(6), what)?;
            let mut aux = at.saturating_add(field(at, 12, what)?);
            for _ in 0..names {
                step(what)?;
                name(field(aux, 0, what)?, what)?;
                aux = aux.saturating_add(field(aux, 4, what)?);
            }
            at = at.saturating_add(field(at, 16, what)?);
        }
    }
    if let (Some(mut at), Some(count)) = (value_of(elf::DT_VERNEED), value_of(elf::DT_VERNEEDNUM)) {
        let what = "its needed versions (DT_VERNEED)";
        for _ in 0..count {
            step(what)?;
            let versions = image.u16(at.saturating_add(2), what)?;
            name(field(at, 4, what)?, what)?;
            let mut aux = at.saturating_add(field(at, 8, what)?);
            for _ in 0..versions {
                step(what)?;
                highest = highest.max(image.u16(aux.saturating_add(6), what)? & 0x7fff);
                name(field(aux, 8, what)?, what)?;
                aux = aux.saturating_add(field(aux, 12, what)?);
            }
            at = at.saturating_add(field(at, 12, what)?);
        }
    }
    Ok(highest)
}

/// Each of `names` that the file at `path` defines among its dynamic symbols must be a function:
/// the host calls them right after `dlopen`. One exported as data (`const char
/// *knob_plugin_api_version = "…";` in C) would be called all the same, and the process would
/// die of SIGSEGV with no message, in every command that scans the plugin path.
pub fn check_exported_functions(path: &std::path::Path, names: &[&str]) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let data = ReadCache::new(BlockReader::new(file));
    // What `check` passed, `dlopen` took; a file `object` cannot read further (no section
    // headers, say) is left to the symbols' own check.
    let Ok(elf) = ElfFile64::<Endianness, _>::parse(&data) else {
        return Ok(());
    };
    for symbol in elf.dynamic_symbols() {
        let Ok(name) = symbol.name() else {
            continue;
        };
        if !symbol.is_definition() || !names.contains(&name) {
            continue;
        }
        let kind = match symbol.kind() {
            SymbolKind::Data => "data",
            SymbolKind::Tls => "thread-local data",
            _ => continue,
        };
        return Err(format!(
            "it exports {name} as {kind}, not as a function; knob calls it, so the library cannot be loaded: build the plugin with knob_plugin_api::export_plugin!"
        ));
    }
    Ok(())
}

/// `what` ends in its verb ("its program headers lie"), so the line reads as a sentence.
fn truncated(what: &str) -> String {
    format!("{what} past the end of the file: it is truncated or damaged")
}

fn segment_name(kind: u32) -> String {
    match kind {
        elf::PT_LOAD => "a loadable segment".into(),
        elf::PT_DYNAMIC => "its dynamic section".into(),
        elf::PT_NOTE => "a note segment".into(),
        elf::PT_TLS => "its thread-local data".into(),
        elf::PT_GNU_PROPERTY => "its property note".into(),
        elf::PT_GNU_EH_FRAME => "its unwind table".into(),
        other => format!("a segment of type {other:#x}"),
    }
}
