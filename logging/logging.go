// Package logging gives every binary of volume-healer the logging flags of Kubernetes components,
// from k8s.io/component-base/logs: -v, --vmodule, --logging-format text|json and the few options
// of each format. A binary registers them on its flag set, parses its command line, and applies
// them with Apply before anything logs.
//
// It imports nothing of the project; only the programs (cmd/..., and refdriver/cli, the reference
// driver's command line) import it, so that no library links component-base.
package logging

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"

	// The json format, which --logging-format offers beside text.
	_ "k8s.io/component-base/logs/json/register"
)

// Formats are the values --logging-format accepts.
var Formats = []string{"text", "json"}

// Options are the logging flags of one binary, as parsed. The zero value is not usable; make one
// with NewOptions.
type Options struct {
	config *logsapi.LoggingConfiguration
	// changed reports whether a flag was given on the command line; set by AddFlags.
	changed func(name string) bool
}

// NewOptions returns the defaults: text format, verbosity 0, no vmodule.
func NewOptions() *Options {
	return &Options{config: logsapi.NewLoggingConfiguration(), changed: func(string) bool { return false }}
}

// AddFlags registers the logging flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	logsapi.AddFlags(o.config, fs)
	o.changed = func(name string) bool { return fs.Changed(name) }
}

// AddGoFlags registers the logging flags on a flag set of the standard library.
func (o *Options) AddGoFlags(fs *flag.FlagSet) {
	logsapi.AddGoFlags(o.config, fs)
	o.changed = func(name string) bool {
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
		return set
	}
}

// Default sets the verbosity and the format from another source, a configuration file for
// instance, where -v and --logging-format were not given on the command line. An empty format
// leaves it as it is.
func (o *Options) Default(verbosity int, format string) {
	if !o.changed("v") && verbosity >= 0 {
		o.config.Verbosity = logsapi.VerbosityLevel(verbosity)
	}
	if !o.changed("logging-format") && format != "" {
		o.config.Format = format
	}
}

// Format is the log format in effect: text or json.
func (o *Options) Format() string { return o.config.Format }

// flagOf names the flag of each field of the logging configuration, so that an error names what
// the user typed.
var flagOf = map[string]string{
	"format":                      "--logging-format",
	"verbosity":                   "-v",
	"vmodule":                     "--vmodule",
	"flushFrequency":              "--" + logsapi.LogFlushFreqFlagName,
	"options.text.splitStream":    "--log-text-split-stream",
	"options.text.infoBufferSize": "--log-text-info-buffer-size",
	"options.json.splitStream":    "--log-json-split-stream",
	"options.json.infoBufferSize": "--log-json-info-buffer-size",
}

// Validate checks the flags and returns an error that names the flag at fault and what it
// accepts.
func (o *Options) Validate() error {
	if !slices.Contains(Formats, o.config.Format) {
		return fmt.Errorf("--logging-format %q: not a log format; use one of %s", o.config.Format, strings.Join(Formats, ", "))
	}
	errs := logsapi.Validate(o.config, nil, nil)
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = flagName(e.Field) + ": " + e.ErrorBody()
	}
	return fmt.Errorf("logging flags: %s", strings.Join(msgs, "; "))
}

// flagName turns a field path of the logging configuration ("vmodule[0]") into its flag.
func flagName(path string) string {
	base, _, _ := strings.Cut(path, "[")
	if f, ok := flagOf[base]; ok {
		return f
	}
	return path
}

// Apply validates the flags and makes klog, and through it every logr logger taken from klog,
// write in the chosen format and verbosity to stderr (and, with --log-text-split-stream or
// --log-json-split-stream, the info messages to stdout). It must be called once per process,
// before anything logs: the configuration of klog is global.
func (o *Options) Apply(stdout, stderr io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	return logsapi.ValidateAndApplyWithOptions(o.config, &logsapi.LoggingOptions{ErrorStream: stderr, InfoStream: stdout}, nil)
}

// ResetForTest undoes Apply, so that a test can apply other flags in the same process. Only for
// tests, with nothing logging at the time.
func ResetForTest() error {
	return logsapi.ResetForTest(nil)
}
