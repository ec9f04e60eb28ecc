package app

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/effectively-once/effectively/internal/printable"
)

// amqpURLYAML holds the YAML key amqp_url until LoadConfig moves it to
// Config.AMQPURL.
type amqpURLYAML struct {
	AMQPURLs urlList `yaml:"amqp_url"`
}

// urlList is a YAML string or list of strings, kept as one string of
// comma-separated items.
type urlList string

// UnmarshalYAML accepts a string or a list of strings.
func (u *urlList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		*u = urlList(strings.Join(list, ","))
		return nil
	}
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*u = urlList(s)
	return nil
}

// ServiceSection is the service: section of the configuration file, kept
// as written until the service decodes it into its own settings (see
// Config.DecodeService). LoadConfig checks every other key of the file;
// the service's struct decides which keys this section may have.
type ServiceSection struct {
	present bool
	path    string       // of the file
	file    []byte       // the whole file, so that errors name its lines
	decoded *atomic.Bool // set by DecodeService, shared by the copies of the Config
}

// NewServiceSection returns the service: section whose content is yaml,
// the service's own settings as they would be written under service: in
// the configuration file (their keys at the top), for a Config built in
// code: a test's (apptest.Config.Service). The service decodes it as it
// does the file's (Config.DecodeService, ServiceConfig); its errors count
// the lines of yaml from 2, after the section's key. A yaml that is not a
// mapping is an error.
func NewServiceSection(text string) (ServiceSection, error) {
	var content yaml.Node
	if err := yaml.Unmarshal([]byte(text), &content); err != nil {
		return ServiceSection{}, fmt.Errorf("service: %w", err)
	}
	if len(content.Content) > 0 && content.Content[0].Kind != yaml.MappingNode {
		return ServiceSection{}, fmt.Errorf("service: want a mapping of the service's settings, got %s", content.Content[0].ShortTag())
	}
	var file strings.Builder
	file.WriteString("service:\n")
	for line := range strings.Lines(text) {
		file.WriteString("  " + line)
	}
	return ServiceSection{present: true, path: "(given in code)", file: []byte(file.String()), decoded: new(atomic.Bool)}, nil
}

// UnmarshalYAML records that the file has the section.
func (s *ServiceSection) UnmarshalYAML(*yaml.Node) error {
	s.present = true
	return nil
}

// DecodeService decodes the service: section of the configuration file
// into v, a pointer to the service's own settings, over what v holds (its
// defaults). The keys are those of v's yaml tags, as for Config. A key that
// v has no field for, or a value of the wrong type, is an error naming it
// (e.g. "service.smtp.port (line 12): ..."). Without the section, v is left
// as it is.
func (c Config) DecodeService(v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("app: DecodeService: want a non-nil pointer, got %T", v)
	}
	if !c.Service.present {
		return nil
	}
	// The whole file is decoded again, into the framework's keys (kept
	// raw, already checked) and v, so that an error names the line as it
	// is in the file.
	doc := reflect.New(reflect.StructOf([]reflect.StructField{
		{Name: "Service", Type: rv.Type(), Tag: `yaml:"service"`},
		{Name: "Framework", Type: reflect.TypeFor[map[string]yaml.Node](), Tag: `yaml:",inline"`},
	}))
	doc.Elem().Field(0).Set(rv)
	dec := yaml.NewDecoder(bytes.NewReader(c.Service.file))
	dec.KnownFields(true)
	if err := dec.Decode(doc.Interface()); err != nil {
		return fmt.Errorf("configuration: %s %s: %w", EnvConfig, c.Service.path, namedYAMLError(c.Service.file, err))
	}
	if err := fractionsInIntegers(c.Service.file, doc.Elem().Type()); err != nil {
		return fmt.Errorf("configuration: %s %s: %w", EnvConfig, c.Service.path, err)
	}
	if c.Service.decoded != nil {
		c.Service.decoded.Store(true)
	}
	return nil
}

// checkServiceDecoded refuses a service: section that the service did not
// decode (app.ServiceConfig, Config.DecodeService) once all its
// constructors ran: its settings, typos included, would be ignored
// without a word, as those of an undeclared consumer would be
// (checkConsumers). New runs it last.
func (c Config) checkServiceDecoded() error {
	if !c.Service.present || c.Service.decoded == nil || c.Service.decoded.Load() {
		return nil
	}
	return fmt.Errorf("configuration: %s %s: service: the service decodes no service: section (app.ServiceConfig or Config.DecodeService), so its settings would be ignored; remove it, or decode it into the service's settings", EnvConfig, c.Service.path)
}

// ServiceConfig returns the service: section of the configuration file
// decoded into a T (see Config.DecodeService), for fx:
//
//	fx.Provide(app.ServiceConfig[Settings])
//
// To start from defaults, provide a function that fills them and calls
// DecodeService instead.
func ServiceConfig[T any](cfg Config) (T, error) {
	var v T
	err := cfg.DecodeService(&v)
	return v, err
}

// Duration is a time.Duration written as "1.5s" or "200ms" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		// A TypeError, which yaml.v3 reports with the line of the value, so
		// that LoadConfig can name the key.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: want a duration such as 500ms or 2s, got %s", n.Line, quoteValue(s))}}
	}
	*d = Duration(v)
	return nil
}

// oneDocument returns an error when dec, which decoded the file's first
// YAML document, finds another that holds anything (a file may end with
// "---" or "..."): the decoder reads only the first, so the settings after
// a "---" would be ignored without a word.
func oneDocument(dec *yaml.Decoder) error {
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
		for _, n := range doc.Content {
			if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!null" {
				return fmt.Errorf("line %d: a second YAML document (after ---): the file holds one, whose settings are read; the settings of another would be ignored", n.Line)
			}
		}
	}
}

// nullKeys returns an error naming the first key of raw's mappings that
// is null (~, null): yaml.v3 drops such an entry of a map, so that the
// settings of "consumers: {~: {attempts: 1}}" were ignored without a
// word.
func nullKeys(raw []byte) error {
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return nil // the decoder reported it
	}
	var walk func(n *yaml.Node, path string) error
	walk = func(n *yaml.Node, path string) error {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				if err := walk(c, path); err != nil {
					return err
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!null" {
					return fmt.Errorf("line %d: %s: a key that is null (~): name it", k.Line, cmp.Or(path, "the file"))
				}
				if err := walk(n.Content[i+1], strings.TrimPrefix(path+"."+printableKey(k.Value), ".")); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(&root, "")
}

// yamlLineRE matches the "line N: problem" entries of yaml.v3's errors;
// yamlFieldRE and yamlValueRE the field or the value that the problem
// names, if any.
var (
	yamlLineRE  = regexp.MustCompile(`^line (\d+): (.*)$`)
	yamlFieldRE = regexp.MustCompile(`^field (\S+) not found in type`)
	yamlValueRE = regexp.MustCompile("^cannot unmarshal !!\\w+ `(.*)` into |, got \"(.*)\"$")
	// yamlDurationRE matches yaml.v3's error for a value that is no
	// duration, decoded into a time.Duration (a consumer's settings).
	yamlDurationRE = regexp.MustCompile("^cannot unmarshal !!\\w+ `(.*)` into time\\.Duration$")
)

// yamlEntry is a key of a YAML file, or a value of a list: its path from
// the root, its own name and its value when that is a scalar.
type yamlEntry struct {
	path, key, value string
}

// namedYAMLError rewrites the entries of a *yaml.TypeError, which name a
// line only ("line 3: cannot unmarshal !!str `three` into int"), to name
// the key of that line as well ("consumers.a.b.attempts (line 3): ..."),
// so that every bad value names its key. On a line of several keys (a
// mapping written {a: 1, b: 2}), it names the key that the problem names
// (an unknown field, a bad value), else the mapping that holds them all.
// Other errors are returned as they are.
func namedYAMLError(raw []byte, err error) error {
	var terr *yaml.TypeError
	if !errors.As(err, &terr) {
		return err
	}
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return err
	}
	lines := make(map[int][]yamlEntry) // line -> the keys and values on it
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := printableKey(k.Value) // a key of the file, not yet checked (see consumerKey)
				if path != "" {
					p = path + "." + p
				}
				if v.Kind == yaml.ScalarNode {
					e := yamlEntry{path: p, key: k.Value, value: v.Value}
					lines[k.Line] = append(lines[k.Line], e)
					if v.Line != k.Line { // a value below its key: yaml.v3 names its line
						lines[v.Line] = append(lines[v.Line], e)
					}
					continue
				}
				lines[k.Line] = append(lines[k.Line], yamlEntry{path: p, key: k.Value})
				if v.Kind == yaml.SequenceNode && v.Line != k.Line {
					// A list below its key: yaml.v3 names the line of its
					// first item when the key wants no list.
					lines[v.Line] = append(lines[v.Line], yamlEntry{path: p, key: k.Value})
				}
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		case yaml.ScalarNode: // an item of a list: a mapping's values are its keys' entries
			if path != "" {
				lines[n.Line] = append(lines[n.Line], yamlEntry{path: path, value: n.Value})
			}
		}
	}
	walk(&root, "")
	errs := make([]error, 0, len(terr.Errors))
	for _, e := range terr.Errors {
		m := yamlLineRE.FindStringSubmatch(e)
		if m == nil {
			errs = append(errs, errors.New(e))
			continue
		}
		line, _ := strconv.Atoi(m[1])
		if d := yamlDurationRE.FindStringSubmatch(m[2]); d != nil {
			// time.Duration's own error, as Duration's reads.
			m[2] = fmt.Sprintf("want a duration such as 500ms or 2s, got %s", quoteValue(d[1]))
		}
		key, ok := keyOfProblem(lines[line], m[2])
		if !ok {
			errs = append(errs, errors.New(e))
			continue
		}
		errs = append(errs, fmt.Errorf("%s (line %d): %s", key, line, printableProblem(m[2])))
	}
	return errors.Join(errs...)
}

// printableProblem returns a problem of yaml.v3's as an error shows it:
// the unknown key that "field <key> not found in type T" names printable
// and cut (printableKey); in any other, the value that yaml.v3 quotes
// (cut to 10 bytes, but as it is) with its control characters escaped
// (printable.String).
func printableProblem(problem string) string {
	if m := yamlFieldRE.FindStringSubmatchIndex(problem); m != nil {
		return problem[:m[2]] + printableKey(problem[m[2]:m[3]]) + problem[m[3]:]
	}
	return printable.String(problem)
}

// keyOfProblem returns the path of the entry of a line that problem is
// about: the only one; else the one of the field or value it names, when
// one alone matches; else the mapping that holds them all.
func keyOfProblem(entries []yamlEntry, problem string) (string, bool) {
	switch len(entries) {
	case 0:
		return "", false
	case 1:
		return entries[0].path, true
	}
	var match func(yamlEntry) bool
	if m := yamlFieldRE.FindStringSubmatch(problem); m != nil {
		match = func(e yamlEntry) bool { return e.key == m[1] }
	} else if m := yamlValueRE.FindStringSubmatch(problem); m != nil {
		value := m[1] + m[2] // one of the two groups matched
		match = func(e yamlEntry) bool { return e.value == value }
	}
	if match != nil {
		var found []string
		for _, e := range entries {
			if match(e) {
				found = append(found, e.path)
			}
		}
		if len(found) == 1 {
			return found[0], true
		}
	}
	common := pathParts(entries[0].path)
	for _, e := range entries[1:] {
		parts := pathParts(e.path)
		n := 0
		for n < len(common) && n < len(parts) && common[n] == parts[n] {
			n++
		}
		common = common[:n]
	}
	if len(common) == 0 {
		return "", false
	}
	return strings.TrimPrefix(strings.Join(common, ""), "."), true
}

// pathParts splits the path of a yamlEntry into its keys and list
// indexes, each with the separator before it ("a.b[0]": "a", ".b",
// "[0]"), so that a list's items share their key with it.
func pathParts(path string) []string {
	var parts []string
	start := 0
	for i := 1; i < len(path); i++ {
		if path[i] == '.' || path[i] == '[' {
			parts = append(parts, path[start:i])
			start = i
		}
	}
	return append(parts, path[start:])
}
