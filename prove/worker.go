package prove

import (
	"context"
	"sync"
)

func startSigkillRelay(ctx context.Context, wg *sync.WaitGroup, e *env) {}
