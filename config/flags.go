package config

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// RegisterFlags adds --config and one flag per key to fs. Each flag's help states its meaning
// and default. Flags are only declared here; Load reads them after fs has been parsed.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String(configFlag, "", usage(
		"YAML configuration file; its keys are overridden by "+envPrefix+"* environment variables and by flags. Also "+configEnv+".",
		""))
	defaults := Default()
	for _, s := range settings {
		name := s.flagName()
		switch p := s.field(&defaults).(type) {
		case *string:
			fs.String(name, *p, usage(s.help, *p))
		case *bool:
			fs.Bool(name, *p, usage(s.help, *p))
		case *int:
			fs.Int(name, *p, usage(s.help, *p))
		case *time.Duration:
			d := *p
			fs.Var(&durationValue{d: &d}, name, s.help)
		case *map[string]string:
			fs.StringToString(name, *p, s.help)
		default:
			panic(fmt.Sprintf("config: key %s has unsupported type %T", s.path, p))
		}
	}
}

// usage appends the default to help when pflag would not print it. pflag prints "(default X)"
// itself unless the default is the zero value of a string, bool or int flag, and a help text
// that omits the default leaves operators guessing whether "" or false is in effect.
func usage(help string, def any) string {
	switch def {
	case "":
		return help + ` (default "")`
	case false:
		return help + " (default false)"
	case 0:
		return help + " (default 0)"
	}
	return help
}

// durationValue is a pflag.Value for time.Duration that prints 2m instead of pflag's 2m0s, so
// --help, the documentation and YAML output show the same text.
type durationValue struct {
	d *time.Duration
}

var _ pflag.Value = (*durationValue)(nil)

// String returns the duration as it would be written in the file.
func (v *durationValue) String() string {
	if v == nil || v.d == nil {
		return formatDuration(0)
	}
	return formatDuration(*v.d)
}

// Set parses a Go duration such as 500ms, 10s or 1h30m.
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("must be a duration with a unit, such as 500ms, 10s, 2m or 1h30m: %w", err)
	}
	*v.d = d
	return nil
}

// Type names the value in --help.
func (v *durationValue) Type() string { return "duration" }
