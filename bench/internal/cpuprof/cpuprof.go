// Package cpuprof starts the CPU profile the bench commands write with
// -cpuprofile.
package cpuprof

import (
	"os"
	"runtime/pprof"
)

// Start writes a CPU profile of this process to path until the returned
// function is called; with path empty it profiles nothing.
func Start(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
