//! `gpreempt-ebpf top`: the watcher feeding the TUI.

use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use crate::{
    cli::{Cli, TopArgs},
    kfd::Paths,
    state::State,
    tui::{self, app::Command},
    watch::{Intervals, Watcher},
};

impl tui::Source for Watcher {
    async fn pump(&mut self) -> Result<()> {
        Watcher::pump(self).await
    }
    fn state(&self) -> &State {
        &self.state
    }
    fn command(&mut self, c: &Command) -> Result<String> {
        match c {
            Command::Suspend { .. } | Command::Resume { .. } => anyhow::bail!(
                "manual suspend/resume needs the controller, which this build does not have yet"
            ),
            Command::Quit => Ok(String::new()),
        }
    }
}

pub async fn main(cli: &Cli, args: &TopArgs) -> Result<ExitCode> {
    let ms = Duration::from_millis;
    let mut w = Watcher::start(
        Paths::default(),
        &cli.kfd_device,
        Intervals {
            reconcile: ms(args.reconcile_interval),
            hqds: ms(args.hqd_interval),
            sample: ms(args.sample_interval),
        },
    )?;
    // stderr lines would tear the screen: problems go to the event log while the TUI is up.
    let level = log::max_level();
    log::set_max_level(log::LevelFilter::Off);
    let r = tui::run(&mut w, ms(args.interval)).await;
    log::set_max_level(level);
    r?;
    Ok(ExitCode::SUCCESS)
}
