//go:build !mattn

package sqlitedrivers

import (
	"database/sql"

	_ "github.com/ncruces/go-sqlite3/driver" // database/sql driver "sqlite3"
)

func init() {
	drivers = append(drivers, driverCase{name: "ncruces", open: func(path string) (*sql.DB, error) {
		return sql.Open("sqlite3", "file:"+path+"?_txlock=immediate")
	}})
}
