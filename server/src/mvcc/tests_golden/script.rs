//! The frame every goldenscript runner of the crate shares: arguments by name or position
//! ([`Args`]), and [`run`] (or [`generate`], for a script given as text), which turn a
//! [`Commands`] implementation into a goldenscript runner (fresh output per command,
//! left-over arguments are an error).

use std::error::Error;
use std::path::Path;

/// A runner's result.
pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Arguments of one command or one nested operation, consumed by name or position; what
/// is left over is an error (a typo must not be silently ignored).
pub struct Args {
    pos: Vec<String>,
    keys: Vec<(String, String)>,
}

impl Args {
    /// The arguments of a goldenscript command.
    pub fn of(command: &goldenscript::Command) -> Args {
        let mut args = Args {
            pos: Vec::new(),
            keys: Vec::new(),
        };
        for arg in &command.args {
            match arg {
                goldenscript::Argument::Positional(v) => args.pos.push(v.clone()),
                goldenscript::Argument::KeyValue(k, v) => args.keys.push((k.clone(), v.clone())),
                other => args.pos.push(other.to_string()),
            }
        }
        args
    }

    /// Splits a nested operation (`put k v lease=1`) into its name and arguments: tokens
    /// are separated by spaces, `'...'` and `"..."` quote (with `\` escaping the next
    /// character), and `name=value` outside quotes is a key/value argument.
    pub fn parse(text: &str) -> Result<(String, Args)> {
        let mut tokens: Vec<(Option<String>, String)> = Vec::new();
        let mut chars = text.chars().peekable();
        loop {
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if chars.peek().is_none() {
                break;
            }
            let (mut key, mut cur, mut quote) = (None, String::new(), None);
            while let Some(c) = chars.next() {
                match (quote, c) {
                    (None, c) if c.is_whitespace() => break,
                    (None, '\'' | '"') => quote = Some(c),
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), '\\') => cur.push(chars.next().ok_or("dangling \\")?),
                    (None, '=')
                        if key.is_none()
                            && !cur.is_empty()
                            && cur.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                    {
                        key = Some(std::mem::take(&mut cur));
                    }
                    (_, c) => cur.push(c),
                }
            }
            if quote.is_some() {
                return Err(format!("unterminated quote in {text:?}").into());
            }
            tokens.push((key, cur));
        }
        let mut args = Args {
            pos: Vec::new(),
            keys: Vec::new(),
        };
        for (k, v) in tokens {
            match k {
                Some(k) => args.keys.push((k, v)),
                None => args.pos.push(v),
            }
        }
        if args.pos.is_empty() {
            return Err(format!("no operation in {text:?}").into());
        }
        let name = args.pos.remove(0);
        Ok((name, args))
    }

    /// The next positional argument, if any.
    pub fn next_pos(&mut self) -> Option<String> {
        (!self.pos.is_empty()).then(|| self.pos.remove(0))
    }

    /// The next positional argument, or an error naming `what`.
    pub fn pos(&mut self, what: &str) -> Result<String> {
        self.next_pos()
            .ok_or_else(|| format!("missing {what}").into())
    }

    /// The next positional argument parsed as a number.
    pub fn pos_num<T: std::str::FromStr>(&mut self, what: &str) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.pos(what)?;
        v.parse().map_err(|e| format!("{what} {v:?}: {e}").into())
    }

    /// The next key/value argument, if any.
    pub fn next_key(&mut self) -> Option<(String, String)> {
        (!self.keys.is_empty()).then(|| self.keys.remove(0))
    }

    /// Removes and returns every value of `key`.
    pub fn take_all(&mut self, key: &str) -> Vec<String> {
        let (taken, kept) = std::mem::take(&mut self.keys)
            .into_iter()
            .partition(|(k, _)| k == key);
        self.keys = kept;
        taken.into_iter().map(|(_, v)| v).collect()
    }

    /// The value of `key` (the last one if repeated).
    pub fn take(&mut self, key: &str) -> Option<String> {
        self.take_all(key).pop()
    }

    /// `key` parsed with `FromStr`, or `default` when absent.
    pub fn num<T: std::str::FromStr>(&mut self, key: &str, default: T) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| format!("{key}={v:?}: {e}").into()),
        }
    }

    /// A `key=true|false` flag, false when absent.
    pub fn flag(&mut self, key: &str) -> Result<bool> {
        self.num(key, false)
    }

    /// Fails if any argument was not consumed.
    pub fn done(self) -> Result<()> {
        if self.pos.is_empty() && self.keys.is_empty() {
            return Ok(());
        }
        Err(format!("unexpected arguments: {:?} {:?}", self.pos, self.keys).into())
    }
}

/// One command being run: its name, arguments and context, and the output it prints.
pub struct Cmd<'a> {
    pub name: &'a str,
    /// The command as written, its arguments in script order (for runners that echo them).
    pub command: &'a goldenscript::Command,
    pub args: Args,
    pub ctx: &'a goldenscript::Context,
    pub out: String,
}

/// A runner reduced to its commands; see [`run`].
pub trait Commands {
    /// Runs `cmd`, printing into `cmd.out`. Errors fail the command (expected with `!`).
    fn command(&mut self, cmd: &mut Cmd<'_>) -> Result<()>;

    /// Checks at the end of the script.
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

struct Runner<'a, C>(&'a mut C);

impl<C: Commands> goldenscript::Runner for Runner<'_, C> {
    type Command = goldenscript::Command;

    fn run(
        &mut self,
        command: &goldenscript::Command,
        ctx: &goldenscript::Context,
    ) -> Result<String> {
        let mut cmd = Cmd {
            name: &command.name,
            command,
            args: Args::of(command),
            ctx,
            out: String::new(),
        };
        self.0.command(&mut cmd)?;
        cmd.args.done()?;
        Ok(cmd.out)
    }

    fn end_script(&mut self) -> Result<()> {
        self.0.finish()
    }
}

/// Runs the script at `path` with `commands`, comparing (or, with `UPDATE_GOLDENFILES=1`,
/// rewriting) its expected output; panics on a difference or a failure.
pub fn run(path: &Path, mut commands: impl Commands) {
    goldenscript::run(&mut Runner(&mut commands), path).expect("goldenscript")
}

/// Runs the script text `input` with `commands` and returns it with each block's output
/// (goldenscript's `generate`), for tests that drive a runner from code and then inspect it.
///
/// Errors: a script that does not parse, or a command failing without `!`.
pub fn generate(commands: &mut impl Commands, input: &str) -> std::io::Result<String> {
    goldenscript::generate(&mut Runner(commands), input)
}
