"""``reach completion bash|zsh|fish``: a shell completion script, made from the parser itself
(every command, option and choice), so it never falls behind the commands."""

from __future__ import annotations

import argparse

from agentreach.cli.options import Commands

SHELLS = ("bash", "zsh", "fish")


def register(commands: Commands) -> None:
    completion = commands.add(
        "completion",
        cmd_completion,
        "print a shell completion script: bash | zsh | fish",
        example=(
            'eval "$(reach completion bash)"        # in ~/.bashrc',
            'eval "$(reach completion zsh)"         # in ~/.zshrc',
            "reach completion fish > ~/.config/fish/completions/reach.fish",
        ),
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    completion.set_defaults(parsers=commands.parsers)


async def cmd_completion(args: argparse.Namespace) -> int:
    print(script(args.shell, args.parsers))
    return 0


def _words(parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """(options, choices of positional arguments) of one command."""
    options: list[str] = []
    choices: list[str] = []
    for action in parser._actions:
        options += [o for o in action.option_strings if o.startswith("--")]
        if not action.option_strings and action.choices:
            choices += [str(c) for c in action.choices]
    return options, choices


def script(shell: str, parsers: dict[str, argparse.ArgumentParser]) -> str:
    if shell == "fish":
        return _fish(parsers)
    cases = []
    for name, parser in sorted(parsers.items()):
        options, choices = _words(parser)
        cases.append(f'        {name}) words="{" ".join(choices + options)}" ;;')
    body = "\n".join(cases)
    bash = f"""_reach() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} words
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{" ".join(sorted(parsers))} --version --help" -- "$cur"))
        return
    fi
    case "${{COMP_WORDS[1]}}" in
{body}
        *) words="" ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _reach reach"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + bash
    return bash


def _fish(parsers: dict[str, argparse.ArgumentParser]) -> str:
    lines = ["complete -c reach -f"]
    names = " ".join(sorted(parsers))
    for name, parser in sorted(parsers.items()):
        help_text = (parser.description or "").split("\n")[0].replace("'", "")
        lines.append(
            f"complete -c reach -n 'not __fish_seen_subcommand_from {names}' -a {name}"
            f" -d '{help_text}'"
        )
        options, choices = _words(parser)
        seen = f"complete -c reach -n '__fish_seen_subcommand_from {name}'"
        if choices:
            lines.append(f"{seen} -a '{' '.join(choices)}'")
        lines += [f"{seen} -l {option[2:]}" for option in options]
    return "\n".join(lines)
