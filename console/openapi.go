package console

import (
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/ferryhq/ferry/opsauth"
)

// OpenAPI returns the OpenAPI 3 document of /api/v1, generated from the
// route table and the Go types the handlers encode, so it cannot drift
// from what they send; a test validates real responses against it.
func (s *Server) OpenAPI() map[string]any {
	g := &schemaGen{schemas: map[string]any{}}
	problem := g.ref(reflect.TypeOf(opsauth.Problem{}))
	paths := map[string]any{}
	for _, rt := range s.routes {
		op := map[string]any{
			"summary":     rt.summary,
			"operationId": strings.ToLower(rt.method) + opName(rt.path),
			"x-role":      string(rt.role),
			"security":    []any{map[string]any{"bearer": []any{}}},
		}
		params := []any{}
		for _, p := range pathParams(rt.path) {
			params = append(params, map[string]any{"name": p, "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		if rt.query != nil {
			for _, p := range g.queryParams(reflect.TypeOf(rt.query)) {
				params = append(params, p)
			}
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if rt.body != nil {
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": g.ref(reflect.TypeOf(rt.body))}}}
		}
		pr := func(desc string) any {
			return map[string]any{"description": desc, "content": map[string]any{"application/problem+json": map[string]any{"schema": problem}}}
		}
		resps := map[string]any{
			"200": map[string]any{"description": "OK", "content": map[string]any{"application/json": map[string]any{"schema": g.ref(reflect.TypeOf(rt.resp))}}},
			"400": pr("invalid input; field names it"),
			"401": pr("not authenticated"),
			"403": pr("role does not allow it, agent identity, read-only console, or cross-origin request"),
			"404": pr("not found"),
			"413": pr("request body too large"),
			"500": pr("internal error"),
		}
		op["responses"] = resps
		m, _ := paths[rt.path].(map[string]any)
		if m == nil {
			m = map[string]any{}
			paths[rt.path] = m
		}
		m[strings.ToLower(rt.method)] = op
	}
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "Ferry console API", "version": "1",
			"description": "The operator API of ferry console: the same ops functions as the ferry CLI. Actions preview unless approve is set; approving needs a reason and the operator role; the audit row records the authenticated identity."},
		"paths": paths,
		"components": map[string]any{
			"schemas":         g.schemas,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
		},
	}
}

func (s *Server) openAPI(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.OpenAPI()) }

var pathParamRE = regexp.MustCompile(`\{([a-z_]+)\}`)

func pathParams(p string) []string {
	var out []string
	for _, m := range pathParamRE.FindAllStringSubmatch(p, -1) {
		out = append(out, m[1])
	}
	return out
}

func opName(p string) string {
	var b strings.Builder
	for _, part := range strings.Split(strings.TrimPrefix(p, "/api/v1"), "/") {
		part = strings.Trim(part, "{}")
		for _, w := range strings.FieldsFunc(part, func(r rune) bool { return r == '_' || r == '-' }) {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

type schemaGen struct{ schemas map[string]any }

var timeType = reflect.TypeOf(time.Time{})

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

func schemaName(t reflect.Type) string {
	n := t.Name()
	// Generic instantiations: Page[github.com/…/ops.OutboxMessage] → PageOutboxMessage.
	if i := strings.Index(n, "["); i >= 0 {
		args := n[i+1 : len(n)-1]
		if j := strings.LastIndex(args, "."); j >= 0 {
			args = args[j+1:]
		}
		n = n[:i] + args
	}
	return nonWord.ReplaceAllString(n, "")
}

// ref returns a schema for t: a $ref for named structs (defined once in
// components), inline otherwise.
func (g *schemaGen) ref(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t.Kind() == reflect.Pointer:
		s := g.ref(t.Elem())
		if _, isRef := s["$ref"]; isRef {
			return map[string]any{"allOf": []any{s}, "nullable": true}
		}
		s["nullable"] = true
		return s
	case t.Kind() == reflect.Struct:
		name := schemaName(t)
		if _, ok := g.schemas[name]; !ok {
			g.schemas[name] = nil // recursion guard
			g.schemas[name] = g.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return map[string]any{"type": "string", "format": "byte"}
	case t.Kind() == reflect.Slice:
		return map[string]any{"type": "array", "items": g.ref(t.Elem()), "nullable": true}
	case t.Kind() == reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.ref(t.Elem())}
	case t.Kind() == reflect.String:
		return map[string]any{"type": "string"}
	case t.Kind() == reflect.Bool:
		return map[string]any{"type": "boolean"}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return map[string]any{"type": "integer"}
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return map[string]any{"type": "number"}
	}
	return map[string]any{}
}

func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			sf := t.Field(i)
			if sf.Anonymous && sf.Type.Kind() == reflect.Struct {
				walk(sf.Type)
				continue
			}
			name := jsonName(sf)
			if name == "" {
				continue
			}
			props[name] = g.ref(sf.Type)
			tag := sf.Tag.Get("json")
			if !strings.Contains(tag, ",omitempty") && !strings.Contains(tag, ",omitzero") {
				required = append(required, name)
			}
		}
	}
	walk(t)
	o := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

func (g *schemaGen) queryParams(t reflect.Type) []any {
	var out []any
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous {
			out = append(out, g.queryParams(sf.Type)...)
			continue
		}
		name := jsonName(sf)
		if name == "" {
			continue
		}
		sch := g.ref(sf.Type)
		p := map[string]any{"name": name, "in": "query", "schema": sch}
		if sf.Type.Kind() == reflect.Slice {
			p["style"], p["explode"] = "form", false
		}
		out = append(out, p)
	}
	return out
}
