package kafka

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoLogger forwards franz-go's warnings and errors to slog. franz-go logs
// broker addresses, topics and errors, never record contents.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel {
	if k.l.Enabled(context.Background(), slog.LevelWarn) {
		return kgo.LogLevelWarn
	}
	return kgo.LogLevelNone
}

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	k.l.Log(context.Background(), lv, "kafka: "+msg, keyvals...)
}
