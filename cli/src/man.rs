//! `knob man`: the whole command line as one man page.
//!
//! clap_mangen renders a page per command, whose SUBCOMMANDS section only points at pages
//! named `knob-create(1)` and the like. knob installs a single page (`knob man >
//! .../man1/knob.1`, the wheel's `share/man/man1/knob.1`), so those references led nowhere
//! and no subcommand's options were documented. Here each subcommand, at every depth, is a
//! section of the one page instead: its synopsis, description and options, as clap_mangen
//! renders them for a page of its own.

use std::io::{self, Write};

use clap::Command;
use clap_mangen::Man;

pub(crate) fn render(mut cli: Command, out: &mut dyn Write) -> io::Result<()> {
    // Built, so that each subcommand knows its full name ("knob experiment export"); `knob
    // help` is clap's own and has nothing to document.
    cli = cli.disable_help_subcommand(true);
    cli.build();
    let page = Man::new(cli.clone());
    let mut roff = Vec::new();
    page.render_title(&mut roff)?;
    page.render_name_section(&mut roff)?;
    page.render_synopsis_section(&mut roff)?;
    page.render_description_section(&mut roff)?;
    page.render_options_section(&mut roff)?;
    writeln!(roff, ".SH COMMANDS")?;
    render_subcommands(&cli, &mut roff)?;
    page.render_version_section(&mut roff)?;
    // Every piece clap_mangen renders starts with the same two lines (defining the string
    // `Aq`); the page needs them once, at its top.
    let roff = String::from_utf8_lossy(&roff);
    let mut lines = roff.lines();
    let preamble: Vec<&str> = lines.by_ref().take(2).collect();
    for line in &preamble {
        writeln!(out, "{line}")?;
    }
    for line in lines.filter(|line| !preamble.contains(line)) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One `.SS` section per subcommand of `command`, each followed by its own subcommands'.
fn render_subcommands(command: &Command, out: &mut Vec<u8>) -> io::Result<()> {
    for sub in command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
    {
        let name = sub.get_bin_name().unwrap_or_else(|| sub.get_name());
        writeln!(out, ".SS \"{name}\"")?;
        let man = Man::new(sub.clone());
        let mut text = Vec::new();
        man.render_synopsis_section(&mut text)?;
        man.render_description_section(&mut text)?;
        man.render_options_section(&mut text)?;
        // clap_mangen heads each part with `.SH`: inside a section of this page the synopsis
        // opens it, the description is a paragraph and the options list (`.TP` items) speaks
        // for itself.
        for line in String::from_utf8_lossy(&text).lines() {
            match line.strip_prefix(".SH ") {
                Some("SYNOPSIS" | "OPTIONS") => {}
                Some(_) => writeln!(out, ".PP")?,
                None => writeln!(out, "{line}")?,
            }
        }
        render_subcommands(sub, out)?;
    }
    Ok(())
}
