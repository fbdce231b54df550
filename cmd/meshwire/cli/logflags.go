package cli

import (
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/internal/logging"
)

// logFlags adds the flags of a long-running command's log (node,
// install); start makes the log the process's default (log/slog), on the
// command's standard error.
func logFlags(fs *pflag.FlagSet) (start func(e *env, cmd string) error) {
	format := fs.String("log-format", logging.FormatText, "the log's format on standard error: text (key=value) or json (one object per line, as the plugins' log)")
	level := fs.String("log-level", "info", "the least level logged: debug, info, warn or error")
	return func(e *env, cmd string) error {
		l, err := logging.NewCommand(e.errOut, *format, *level)
		if err != nil {
			return usagef("%s: %v", cmd, err)
		}
		slog.SetDefault(l)
		return nil
	}
}
