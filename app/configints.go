package app

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// fractionsInIntegers returns an error naming each key of the YAML file
// raw whose value is a number with a fraction (1.5) where t, the type the
// file decodes into, has an integer: yaml.v3 truncates it without a word
// (attempts: 1.5 would be 1 attempt). It names the key as namedYAMLError
// does, printable. Keys that t has no field for, and values of a type that decodes
// itself (Duration), are left to the decoder.
func fractionsInIntegers(raw []byte, t reflect.Type) error {
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil || len(root.Content) == 0 {
		return nil // the decoder reports it
	}
	var errs []error
	var walk func(n *yaml.Node, t reflect.Type, path string)
	walk = func(n *yaml.Node, t reflect.Type, path string) {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) || t == reflect.TypeFor[yaml.Node]() {
			return
		}
		switch t.Kind() {
		case reflect.Struct, reflect.Map:
			if n.Kind != yaml.MappingNode {
				return
			}
			for i := 0; i+1 < len(n.Content); i += 2 {
				key := n.Content[i].Value
				var (
					ft reflect.Type
					ok = true
				)
				if t.Kind() == reflect.Struct {
					ft, ok = yamlFieldType(t, key)
				} else {
					ft = t.Elem()
				}
				if ok {
					walk(n.Content[i+1], ft, strings.TrimPrefix(path+"."+printableKey(key), "."))
				}
			}
		case reflect.Slice, reflect.Array:
			if n.Kind == yaml.SequenceNode {
				for i, c := range n.Content {
					walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
				}
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			if f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64); n.Kind == yaml.ScalarNode &&
				n.ShortTag() == "!!float" && err == nil && f != math.Trunc(f) {
				errs = append(errs, fmt.Errorf("%s (line %d): want a whole number, got %s", path, n.Line, quoteValue(n.Value)))
			}
		}
	}
	walk(root.Content[0], t, "")
	return errors.Join(errs...)
}

// yamlFieldType returns the type of the field of struct t that the YAML
// key name decodes into, looking into inline structs, as yaml.v3 does:
// the name in the field's yaml tag, else the field's name in lower case.
func yamlFieldType(t reflect.Type, name string) (reflect.Type, bool) {
	for f := range t.Fields() {
		tagName, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case tagName == "-":
			continue
		case strings.Contains(","+opts+",", ",inline,"):
			if f.Type.Kind() != reflect.Struct {
				continue
			}
			if ft, ok := yamlFieldType(f.Type, name); ok {
				return ft, true
			}
			continue
		case !f.IsExported():
			continue
		case tagName == "":
			tagName = strings.ToLower(f.Name)
		}
		if tagName == name {
			return f.Type, true
		}
	}
	return nil, false
}
