package main

import (
	"errors"
	"sort"
	"strings"

	"github.com/spf13/cobra"
)

// finishCommandTree applies the rules every command follows, once, after
// the tree is built, so that a command added later follows them too:
//
//   - a command with subcommands answers a missing or mistyped one with a
//     usage error suggesting the nearest names ("did you mean status?");
//   - any complaint about positional arguments is a usage error (exit 2),
//     whichever validator made it (cobra.NoArgs's would exit 1);
//   - errors pass through explain, which turns an unreachable, missing or
//     unmigrated database into what to do about it, and a refused action
//     into the database's reason (as JSON on stdout too with --json).
func finishCommandTree(root *cobra.Command) {
	// help and completion are added by cobra when the command runs;
	// adding them now lets them follow the rules too.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.HasAvailableSubCommands() {
			c.Args = cobra.ArbitraryArgs
			c.RunE = missingSubcommand
			c.Run = nil
		}
		if validate := c.Args; validate != nil {
			c.Args = func(cmd *cobra.Command, args []string) error {
				if err := validate(cmd, args); err != nil {
					var u usageError
					if errors.As(err, &u) {
						return err
					}
					return usageError{err}
				}
				return nil
			}
		}
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error {
				err := explain(commandName(cmd), run(cmd, args))
				var refused refusedError
				if errors.As(err, &refused) && jsonWanted(cmd) {
					// A script asked for JSON: the refusal, with its
					// SQLSTATE, on stdout too.
					if werr := writeJSON(cmd.OutOrStdout(), refused.json()); werr != nil {
						return errors.Join(err, werr)
					}
				}
				return err
			}
		}
	}
	walk(root)
}

// missingSubcommand is the action of a command that only groups others:
// with no argument the root prints its help and the others a usage error;
// an unknown one is refused with the nearest names.
func missingSubcommand(cmd *cobra.Command, args []string) error {
	names := subcommandNames(cmd)
	if len(args) == 0 {
		if !cmd.HasParent() {
			return cmd.Help()
		}
		return usagef("%s needs a subcommand: %s", cmd.Name(), orList(names))
	}
	what := "command"
	if cmd.HasParent() {
		what = cmd.Name() + " subcommand"
	}
	hint := "use " + orList(names)
	if !cmd.HasParent() {
		hint = "see outboxctl --help"
	}
	if near := suggest(args[0], names); len(near) > 0 {
		hint = "did you mean " + orList(near) + "?"
	}
	return usagef("unknown %s %q: %s", what, args[0], hint)
}

// subcommandNames are the names an operator may type after cmd (help and
// completion only at the root, where they are listed).
func subcommandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() || c.Name() == "help" {
			names = append(names, c.Name())
		}
	}
	return names
}

// orList writes names as "a, b or c".
func orList(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// suggest returns the names near typed, nearest first: within an edit
// distance of 1 for words of up to four letters and 2 beyond, counting a
// swap of two neighbouring letters as one edit ("stauts" is one edit from
// status, where plain Levenshtein, which cobra's suggestions use, counts
// two and suggests nothing), or names typed begins (a prefix of at least
// two letters).
func suggest(typed string, names []string) []string {
	typed = strings.ToLower(typed)
	limit := 1
	if len(typed) > 4 {
		limit = 2
	}
	type near struct {
		name     string
		distance int
	}
	var found []near
	for _, name := range names {
		d := editDistance(typed, strings.ToLower(name))
		switch {
		case d <= limit:
			found = append(found, near{name, d})
		case len(typed) >= 2 && strings.HasPrefix(name, typed):
			found = append(found, near{name, limit + 1})
		}
	}
	sort.SliceStable(found, func(i, j int) bool { return found[i].distance < found[j].distance })
	out := make([]string, len(found))
	for i, f := range found {
		out[i] = f.name
	}
	return out
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent letters, each
// one edit.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// jsonWanted reports whether the command was asked for JSON (--json).
func jsonWanted(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("json")
	return f != nil && f.Value.String() == "true"
}
