package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/outboxkit/dispatcher/shared/telemetry/redact"
)

// handler drops attributes and groups with sensitive keys before the JSON
// handler sees them; the JSON handler's ReplaceAttr (replaceAttr) masks what
// remains. Dropping here rather than in ReplaceAttr keeps the output valid
// JSON when a whole group goes.
//
// It also renames a top-level attribute that would collide with a key of the
// record itself ("msg" → "attr_msg"): ReplaceAttr cannot tell the caller's
// "msg" from slog's, and a record with two "message" keys is ambiguous.
type handler struct {
	inner slog.Handler
	// muted is set under a WithGroup whose name is sensitive: everything
	// logged into that group is dropped, the message is kept.
	muted bool
	// grouped is set under any other WithGroup: attributes are no longer
	// top-level, so they cannot collide with the record's keys.
	grouped bool
}

// reservedKeys are the record's own keys, slog's and ours.
var reservedKeys = map[string]bool{
	slog.TimeKey: true, slog.LevelKey: true, slog.MessageKey: true, slog.SourceKey: true,
	KeyTimestamp: true, KeyMessage: true,
}

var _ slog.Handler = (*handler)(nil)

func (h *handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	if h.muted || h.recordNeedsRewrite(r) {
		rewritten := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
		if !h.muted {
			r.Attrs(func(a slog.Attr) bool {
				if a, ok := h.rewrite(a); ok {
					rewritten.AddAttrs(a)
				}
				return true
			})
		}
		r = rewritten
	}
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if h.muted {
		return h
	}
	kept := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		if a, ok := h.rewrite(a); ok {
			kept = append(kept, a)
		}
	}
	return &handler{inner: h.inner.WithAttrs(kept), grouped: h.grouped}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if h.muted || redact.SensitiveKey(name) {
		return &handler{inner: h.inner, muted: true}
	}
	return &handler{inner: h.inner.WithGroup(name), grouped: true}
}

// recordNeedsRewrite is the cheap check that spares the common record (no
// sensitive or reserved key anywhere) a copy.
func (h *handler) recordNeedsRewrite(r slog.Record) bool {
	needs := false
	r.Attrs(func(a slog.Attr) bool {
		needs = (!h.grouped && reservedKeys[a.Key]) || attrNeedsPruning(a)
		return !needs
	})
	return needs
}

// rewrite prunes a and renames it when it collides with the record's keys.
func (h *handler) rewrite(a slog.Attr) (slog.Attr, bool) {
	a, ok := prune(a)
	if ok && !h.grouped && reservedKeys[a.Key] {
		a.Key = "attr_" + a.Key
	}
	return a, ok
}

func attrNeedsPruning(a slog.Attr) bool {
	if redact.SensitiveKey(a.Key) {
		return true
	}
	v := a.Value.Resolve()
	if v.Kind() != slog.KindGroup {
		return false
	}
	for _, m := range v.Group() {
		if attrNeedsPruning(m) {
			return true
		}
	}
	return false
}

// prune resolves a, drops it when its key is sensitive, and prunes a group's
// members, dropping a group left empty.
func prune(a slog.Attr) (slog.Attr, bool) {
	if redact.SensitiveKey(a.Key) {
		return slog.Attr{}, false
	}
	a.Value = a.Value.Resolve()
	if a.Value.Kind() != slog.KindGroup {
		return a, true
	}
	members := a.Value.Group()
	kept := make([]slog.Attr, 0, len(members))
	for _, m := range members {
		if m, ok := prune(m); ok {
			kept = append(kept, m)
		}
	}
	if len(kept) == 0 {
		return slog.Attr{}, false
	}
	return slog.Attr{Key: a.Key, Value: slog.GroupValue(kept...)}, true
}

// cleanTree returns x as the JSON handler would write it, minus members with
// sensitive keys and with credentials masked in every string: a struct or a
// map logged whole (a claimed message, a map of headers) must not carry its
// payload or an Authorization header into the log.
func cleanTree(x any) any {
	raw, err := json.Marshal(x)
	if err != nil {
		return redact.String(fmt.Sprintf("%+v", x))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // keep integers exact
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return redact.String(string(raw))
	}
	return cleanNode(tree)
}

func cleanNode(n any) any {
	switch v := n.(type) {
	case map[string]any:
		for k, member := range v {
			if redact.SensitiveKey(k) {
				delete(v, k)
				continue
			}
			v[k] = cleanNode(member)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = cleanNode(e)
		}
		return v
	case string:
		return redact.String(v)
	}
	return n
}
