//! Checks a plugin file before `dlopen`: the dynamic loader maps the segments the program
//! headers describe and reads the dynamic section through them, so a file cut short (a copy
//! interrupted, a full disk) makes it touch pages past the end of the file, and the process dies
//! of SIGBUS with no message. Here every range the loader will use is checked against the file
//! first, so such a file gets a one-line refusal and the other plugins still load.
//!
//! Only what the loader reads to map the file and find its symbols is checked: the program
//! headers, every segment's bytes, the segments it reads in memory (dynamic, notes, TLS image)
//! and the tables the dynamic section points to. A file that passes may still be refused by
//! `dlopen` itself (wrong architecture, say), with its message. This guards against damage, not
//! against a file crafted to harm: loading a plugin runs its code anyway.

use object::elf::{self, FileHeader64, ProgramHeader64};
use object::read::elf::{Dyn, ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, Object, ObjectSymbol, ReadCache, ReadRef, SymbolKind};

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
    check(&ReadCache::new(file))
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
        dynamic_entries = Some(entries.len());
    }
    let dynamic_entries =
        dynamic_entries.ok_or_else(|| "an ELF file without a dynamic section".to_string())?;
    Ok(ElfSummary {
        load_segments: loads.len(),
        dynamic_entries,
    })
}

/// Each of `names` that the file at `path` defines among its dynamic symbols must be a function:
/// the host calls them right after `dlopen`. One exported as data (`const char
/// *knob_plugin_api_version = "…";` in C) would be called all the same, and the process would
/// die of SIGSEGV with no message, in every command that scans the plugin path.
pub fn check_exported_functions(path: &std::path::Path, names: &[&str]) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let data = ReadCache::new(file);
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
